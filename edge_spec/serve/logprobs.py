"""``logprobs`` / ``top_logprobs`` on both endpoints: the request fields and OpenAI's response shapes.

The values come from the engine (edge_spec.runtime.logprobs: the distribution each token was drawn from —
temperature, then top-k / top-p / min-p — and at temperature 0 the plain softmax at T = 1). Here they are
lined up with the text the client receives: a token is reported once the text it starts is sent, so a
token inside a cut stop string, or the end-of-turn token after the text, is never reported, and a stream
reports exactly the tokens the whole reply does.

Shapes: chat ``choices[].logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}]}], "refusal": None}``; completions (OpenAI's legacy form) ``{"tokens", "token_logprobs",
"top_logprobs": [{token: logprob}], "text_offset"}``, offsets counted in characters from the start of the
prompt. A token's text is its UTF-8 bytes decoded, a byte that ends or starts a split character shown as
``\\xNN``; ``bytes`` has them raw.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_spec.runtime.config import StreamEvent
from edge_spec.runtime.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from edge_spec.serve.errors import bad_request


def chat_logprobs(data: dict[str, Any]) -> int | None:
    """Chat's ``logprobs`` (bool) and ``top_logprobs`` (0..20, needs logprobs) -> alternatives per token, or None."""
    on = data.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise bad_request(f"logprobs must be true or false, not {_clip(json.dumps(on))}.", "logprobs",
                          "invalid_type")
    top = data.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be a whole number in [0, {MAX_TOP_LOGPROBS}], not "
                              f"{_clip(json.dumps(top))}.", "top_logprobs")
        if top > 0 and not on:
            raise bad_request("top_logprobs needs logprobs: true; send both.", "top_logprobs")
    return (top or 0) if on else None


def completion_logprobs(data: dict[str, Any]) -> int | None:
    """Completions' ``logprobs``: the number of alternatives per token (0..20), or None (off)."""
    value = data.get("logprobs")
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise bad_request(f"logprobs on /v1/completions is the number of alternatives per token, a whole number in "
                          f"[0, {MAX_TOP_LOGPROBS}], not {_clip(json.dumps(value))}.", "logprobs")
    return value


@dataclass(frozen=True)
class Entry:
    """One reported token: its values, its bytes and where its text starts in the generated text (characters)."""

    lp: TokenLogprob
    data: bytes
    offset: int


class Tracker:
    """Lines up the engine's per-token values with the text sent (module docstring). ``token_bytes(id)``."""

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self.token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = 0  # characters the tokens so far decode to
        self._sent = 0  # characters of text the engine has given out
        self._held: list[Entry] = []

    def push(self, ev: StreamEvent) -> list[Entry]:
        """The event's tokens in; out the entries whose text has now been sent (at the last event: all that were)."""
        for lp in ev.logprobs:
            data = self.token_bytes(lp.token)
            self._held.append(Entry(lp, data, self._chars))
            self._chars += len(self._utf8.decode(data))
        self._sent += len(ev.text)
        ready = [e for e in self._held if e.offset < self._sent]
        self._held = [] if ev.finish_reason else self._held[len(ready):]
        return ready

    def chat(self, entries: list[Entry]) -> dict[str, Any]:
        return {"content": [{**self._item(e.lp.token, e.lp.logprob, e.data),
                             "top_logprobs": [self._item(t, v) for t, v in e.lp.top]} for e in entries],
                "refusal": None}

    def completion(self, entries: list[Entry], base: int) -> dict[str, Any]:
        """Legacy shape; ``base``: characters before the generated text (the prompt)."""
        return {"tokens": [_text(e.data) for e in entries], "token_logprobs": [e.lp.logprob for e in entries],
                "top_logprobs": [{_text(self.token_bytes(t)): v for t, v in e.lp.top} for e in entries],
                "text_offset": [base + e.offset for e in entries]}

    def _item(self, token: int, logprob: float, data: bytes | None = None) -> dict[str, Any]:
        data = self.token_bytes(token) if data is None else data
        return {"token": _text(data), "logprob": logprob, "bytes": list(data)}


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."
