"""Tool calls in a reply, Hermes / Qwen2.5 style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The model writes each call as a JSON object inside the tags (the syntax its chat template teaches it,
llama-server's Hermes-2-Pro format); several calls are several blocks. Small models (Qwen2.5-Coder-1.5B)
often write the same object in a Markdown block instead, ```` ```json {...} ``` ````, which llama-server's
Hermes parser also reads as a call: so do we, when the name is one of the request's tools (``names``), so
that a JSON example in an answer is not mistaken for one. :class:`ToolCallStream` reads the
reply as it streams: text outside the blocks comes out as content at once (except a tail that may be the
start of an opening tag, held until it is known), a block comes out as one :class:`ToolCall` when it closes.
A block whose body is not such an object stays text, tags and all, as llama-server leaves it; so does an
unclosed block at the end of the reply unless its body is a complete call (the model stopped right after it).
Whitespace that only separates content from a block is dropped. :func:`parse_tool_calls` is the same reader
over a whole reply, so a streamed reply and a whole one always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edge_spec.runtime.template import TOOL_CALL_OPEN

TOOL_CALL_CLOSE = "</tool_call>"
FENCE_OPEN, FENCE_CLOSE = "```json", "```"
_CLOSERS = {TOOL_CALL_OPEN: TOOL_CALL_CLOSE, FENCE_OPEN: FENCE_CLOSE}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object as text (OpenAI's form), compact


def parse_call(body: str) -> ToolCall | None:
    """The call in one block's body (between the tags), or None when it is not ``{"name": str, "arguments":
    object}`` (arguments may also be a JSON string holding an object, or absent: ``{}``)."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallStream:
    """Splits a streamed reply into content and tool calls; :meth:`feed` / :meth:`finish` return the pieces in
    order: ``str`` (content) or :class:`ToolCall`."""

    def __init__(self, names: frozenset[str] | None = None) -> None:
        self.names = names  # the request's tool names: a ```json block is a call only if it names one of them
        self._buf = ""  # text not yet given out
        self._in_call = False  # _buf is the body of an open block
        self._opener = TOOL_CALL_OPEN  # the open block's opening tag
        self._after_call = False  # drop whitespace until the next non-space content
        self._gap = ""  # the whitespace before the open block: given back if the block is not a call
        self.calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        out: list[str | ToolCall] = []
        while True:
            if self._in_call:
                closer = _CLOSERS[self._opener]
                end = self._buf.find(closer)
                if end < 0:
                    return out
                body, self._buf = self._buf[:end], self._buf[end + len(closer):]
                self._close(body, closer, out)
                continue
            found = [(at, o) for o in self._openers() if (at := self._buf.find(o)) >= 0]
            if found:
                at, self._opener = min(found)
                before = self._buf[:at]
                self._content(before.rstrip(), out)
                self._gap = before[len(before.rstrip()):]
                self._buf = self._buf[at + len(self._opener):]
                self._in_call = True
                continue
            # hold back a tail that may begin an opening tag, and trailing whitespace (it may precede a block)
            keep = next((k for k in range(min(len(self._buf), len(FENCE_OPEN + TOOL_CALL_OPEN)), 0, -1)
                         if any(o.startswith(self._buf[-k:]) for o in self._openers())), 0)
            head, tail = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            stripped = head.rstrip()
            self._content(stripped, out)
            self._buf = head[len(stripped):] + tail
            return out

    def finish(self) -> list[str | ToolCall]:
        """The end of the reply: whatever is held comes out."""
        out: list[str | ToolCall] = []
        if self._in_call:
            self._in_call = False
            self._close(self._buf, "", out)
        elif self.calls:
            self._content(self._buf.rstrip(), out)
        else:
            self._content(self._buf, out)
        self._buf = ""
        return out

    def _openers(self) -> tuple[str, ...]:
        return (TOOL_CALL_OPEN, FENCE_OPEN) if self.names else (TOOL_CALL_OPEN,)

    def _close(self, body: str, closer: str, out: list[str | ToolCall]) -> None:
        self._in_call = False
        call = parse_call(body)
        if call is not None and self._opener == FENCE_OPEN and call.name not in (self.names or ()):
            call = None
        if call is None:  # not a call: the block stays text, with the whitespace before it
            self._content(self._gap + self._opener + body + closer, out, keep_space=True)
            return
        out.append(call)
        self.calls += 1
        self._after_call = True

    def _content(self, text: str, out: list[str | ToolCall], keep_space: bool = False) -> None:
        if self._after_call and not keep_space:
            text = text.lstrip()
        if text:
            self._after_call = False
            if out and isinstance(out[-1], str):
                out[-1] += text
            else:
                out.append(text)


def parse_tool_calls(text: str, names: frozenset[str] | None = None) -> tuple[str, list[ToolCall]]:
    """A whole reply -> (content, calls): the content is the text outside the blocks (see the module docstring);
    ``names``: the tools offered (``` ```json ``` blocks are read only for these)."""
    stream = ToolCallStream(names)
    pieces = stream.feed(text) + stream.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    return content, [p for p in pieces if isinstance(p, ToolCall)]
