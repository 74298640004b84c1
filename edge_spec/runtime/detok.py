"""Streaming detokenization that never emits a broken UTF-8 sequence.

Byte-level BPE splits one character over several tokens. For byte-level tokenizers we keep a
table token id -> bytes and feed an incremental UTF-8 decoder: O(1) per token, and a partial
character simply stays inside the decoder until its last byte arrives. Other tokenizers use
the generic scheme: re-decode a small window and release text only when it does not end in
U+FFFD.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from tokenizers import Tokenizer

_WINDOW = 6  # generic path: tokens of left context re-decoded so spacing at the boundary is right


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable-character map, used by the ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_table(tok: Tokenizer, skip_special_tokens: bool = True) -> list[bytes] | None:
    """Token id -> raw bytes for a ByteLevel tokenizer; None when the decoder is something else."""
    if type(tok.decoder).__name__ != "ByteLevel":
        return None
    inverse = {c: b for b, c in _bytes_to_unicode().items()}
    special = {a.content for a in tok.get_added_tokens_decoder().values() if a.special}
    table: list[bytes] = []
    for i in range(tok.get_vocab_size()):
        piece = tok.id_to_token(i)
        if piece is None or (skip_special_tokens and piece in special):
            table.append(b"")
        elif all(c in inverse for c in piece):
            table.append(bytes(inverse[c] for c in piece))
        else:  # an added (non byte-level) token: its text as is
            table.append(piece.encode("utf-8"))
    return table


class StreamDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True,
                 table: list[bytes] | None = None) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.ids: list[int] = []
        self.prefix = 0  # generic path: start of the decode window
        self.read = 0  # generic path: ids before this are already emitted
        self.text = ""
        self._partial = False  # generic path: the last decode ended in an incomplete character

    @property
    def pending(self) -> bool:
        """Bytes of a character not complete yet are held back (they follow ``text``)."""
        if self.table is not None:
            return bool(self._utf8.getstate()[0])
        return self._partial

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the newly final text (maybe empty)."""
        if self.table is not None:
            delta = self._utf8.decode(b"".join([self.table[i] for i in ids]))
            self.text += delta
            return delta
        self.ids.extend(ids)
        prefix_text = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
        full = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
        self._partial = full.endswith("\ufffd")
        if self._partial or len(full) <= len(prefix_text):
            return ""
        delta = full[len(prefix_text):]
        self.read = len(self.ids)
        self.prefix = max(0, self.read - _WINDOW)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a generation: release what is left; a dangling partial character is dropped."""
        if self.table is not None:
            delta = self._utf8.decode(b"", final=True).rstrip("\ufffd")
        else:
            full = self.tok.decode(self.ids, skip_special_tokens=self.skip)
            delta = full[len(self.text):] if full.startswith(self.text) else ""
            delta = delta.rstrip("\ufffd")
            self.read = len(self.ids)
            self._partial = False
        self.text += delta
        return delta


def find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    """Index of the earliest occurrence of any of ``stops`` in ``text`` at or after ``start`` (None: none)."""
    best = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best):
            best = i
    return best
