"""An editor plugin as a client: the ``/infill`` request llama.vscode builds at a cursor, and what it inserts.

Read from ggml-org/llama.vscode (src/completion.ts, src/llama-server.ts, src/utils.ts, src/extra-context.ts,
package.json defaults; commit 3938fb3, 2026-08):

* ``input_prefix``: the ``n_prefix`` (256) lines before the cursor's line, each followed by a line break;
  ``prompt``: the cursor's line up to the cursor, or "" when that is only spaces and tabs (the plugin then strips
  as many leading spaces from the answer); ``input_suffix``: the rest of the cursor's line, a line break, the
  ``n_suffix`` (64) lines after it joined by line breaks, a line break.
* ``n_indent``: the cursor line's indentation (its length minus its ``trimStart()`` length), sent when > 0;
  ``t_max_prompt_ms`` 500 and ``t_max_predict_ms`` 500 (package.json's defaults), ``n_predict`` 128,
  ``top_k`` 40, ``top_p`` 0.99, ``samplers`` ["top_k", "top_p", "infill"], ``cache_prompt``, ``id_slot`` 0,
  ``stream`` false, ``n_cmpl`` (its ``max_parallel_completions``).
* ``input_extra``: the ring buffer of chunks ``{"text", "time", "filename"}``, a chunk being a file's lines (all of
  them below 64) joined by line breaks plus one more, ``filename`` the file's path.
* The answer's ``content`` is split into lines, trailing blank lines dropped, discarded when it only repeats the
  text after the cursor (``shouldDiscardSuggestion``), cut to its first line or before the rest of the cursor's
  line when that is not empty (``updateSuggestion``), its leading spaces removed as above, then inserted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

N_PREFIX, N_SUFFIX, N_PREDICT = 256, 64, 128
T_MAX_PROMPT_MS = T_MAX_PREDICT_MS = 500
CURSOR = "<CURSOR>"


@dataclass(frozen=True)
class Cursor:
    """A file and where the cursor is in it."""

    doc: str  # the file's text
    offset: int  # the cursor, as a character offset into doc

    @classmethod
    def parse(cls, marked: str) -> Cursor:
        """A file with one ``<CURSOR>`` mark."""
        return cls(marked.replace(CURSOR, "", 1), marked.index(CURSOR))

    @property
    def lines(self) -> list[str]:
        return self.doc.split("\n")  # as VS Code counts lines: a file ending in a line break has an empty last one

    @property
    def line(self) -> int:
        return self.doc.count("\n", 0, self.offset)

    @property
    def line_prefix(self) -> str:
        return self.doc[self.doc.rfind("\n", 0, self.offset) + 1:self.offset]

    @property
    def line_suffix(self) -> str:
        return self.lines[self.line][len(self.line_prefix):]


def chunk(filename: str, text: str, time_ms: int = 0) -> dict[str, Any]:
    """A small file as a ring-buffer chunk (pickChunk: its lines joined by line breaks, plus one)."""
    return {"text": "\n".join(text.split("\n")) + "\n", "time": time_ms, "filename": filename}


def request(cur: Cursor, extra: list[dict[str, Any]], *, n_predict: int = N_PREDICT, indent: bool = True,
            t_max_predict_ms: int = T_MAX_PREDICT_MS, n_cmpl: int = 1) -> dict[str, Any]:
    """llama.vscode's /infill body at ``cur`` (module docstring); ``indent`` False leaves ``n_indent`` out."""
    lines, line, prefix = cur.lines, cur.line, cur.line_prefix
    text = lines[line]
    n_indent = len(text) - len(text.lstrip())
    prompt = "" if re.fullmatch(r"[ \t]*", prefix) else prefix
    end = min(len(lines) - 1, line + N_SUFFIX)
    body: dict[str, Any] = {
        "id_slot": 0,
        "input_prefix": "\n".join(lines[max(0, line - N_PREFIX):line]) + "\n",
        "input_suffix": cur.line_suffix + "\n" + "\n".join(lines[line + 1:end + 1]) + "\n",
        "input_extra": extra, "prompt": prompt, "n_predict": n_predict, "n_cmpl": n_cmpl,
        "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
        "t_max_prompt_ms": T_MAX_PROMPT_MS, "t_max_predict_ms": t_max_predict_ms}
    if indent and n_indent:
        body["n_indent"] = n_indent
    return body


def inserted(cur: Cursor, content: str) -> str | None:
    """What llama.vscode inserts at the cursor for an answer's ``content`` (None: it shows nothing)."""
    lines = re.split(r"\r?\n", content)
    while lines and lines[-1].strip() == "":
        lines.pop()
    if _discard(cur, lines):
        return None
    suffix = cur.line_suffix
    compl = "\n".join(lines)
    if suffix.strip() != "":
        if lines[0].endswith(suffix):
            compl = lines[0][:-len(suffix)]
        elif len(lines) > 1:
            compl = lines[0]
    prefix = cur.line_prefix
    strip = len(prefix) if re.fullmatch(r"[ \t]*", prefix) else 0
    i = 0  # removeLeadingSpaces, its operator precedence included: tabs go whatever the count
    while i < len(compl) and ((i < strip and compl[i] == " ") or compl[i] == "\t"):
        i += 1
    return compl[i:]


def _discard(cur: Cursor, lines: list[str]) -> bool:
    """shouldDiscardSuggestion: an empty answer, or one that repeats the text after the cursor."""
    doc, line, prefix, suffix = cur.lines, cur.line, cur.line_prefix, cur.line_suffix

    def at(i: int) -> str | None:
        return doc[i] if 0 <= i < len(doc) else None

    if not lines or (len(lines) == 1 and lines[0].strip() == ""):
        return True
    if line == len(doc) - 1:
        return False
    if len(lines) > 1 and (lines[0].strip() == "" or lines[0].strip() == suffix.strip()) \
            and all(v == at(line + 1 + i) for i, v in enumerate(lines[1:])):
        return True
    if len(lines) == 1 and lines[0] == suffix:
        return True
    first = line + 1
    while first < len(doc) and doc[first].strip() == "":
        first += 1
    if first >= len(doc):
        return False
    if prefix + lines[0] == doc[first]:
        if len(lines) == 1:
            return True
        nxt = at(first + 1) or ""
        if len(lines) == 2 and lines[1] == nxt[:len(lines[1])]:
            return True
        if len(lines) > 2 and all(v == at(first + 1 + i) for i, v in enumerate(lines[1:])):
            return True
    return False
