"""One reply on its way out: the engine's events -> the response body, or the streamed chunks.

Plain text passes straight through; with ``logprobs`` each token's values ride with the text they start
(serve/logprobs.py), and with tools the text goes through the tool-call reader first (serve/tools.py), so
content and calls come out as OpenAI shapes them. The whole body and the stream are built from the same
readers, so they always say the same thing.
"""

from __future__ import annotations

from typing import Any

from edge_spec.runtime.config import Stats, StreamEvent
from edge_spec.serve.logprobs import Entry, Tracker
from edge_spec.serve.responses import Shaper
from edge_spec.serve.tools import ToolReply


class Reply:
    """``tracker``: logprobs were asked for; ``tools``: the reply is read for tool calls; ``base``: characters
    before the generated text (completions' ``text_offset`` counts from the prompt's start)."""

    def __init__(self, shaper: Shaper, tracker: Tracker | None = None, tools: ToolReply | None = None,
                 base: int = 0) -> None:
        self.shaper, self.tracker, self.tools, self.base = shaper, tracker, tools, base
        self.texts: list[str] = []
        self.entries: list[Entry] = []
        self.calls: list[dict[str, Any]] = []
        self.finish = "length"

    # ---------------------------------------------------------------- whole
    def add(self, ev: StreamEvent) -> None:
        """Collect one event for :meth:`whole`."""
        self.texts.append(ev.text)
        self.finish = ev.finish_reason or self.finish
        if self.tracker is not None:
            self.entries += self.tracker.push(ev)

    def whole(self, st: Stats, info: dict[str, Any]) -> dict[str, Any]:
        text = "".join(self.texts)
        if self.tools is not None:
            content, calls = self.tools.feed(text)
            more, late = self.tools.finish()
            text, self.calls = content + more, calls + late
        finish = "tool_calls" if self.calls else self.finish
        return self.shaper.whole(text, finish, st, info, logprobs=self._logprobs(self.entries),
                                 tool_calls=self.calls or None)

    # ---------------------------------------------------------------- streamed
    def chunks(self, ev: StreamEvent) -> list[dict[str, Any]]:
        """The chunks one event makes (none when it brings nothing to send yet)."""
        self.finish = ev.finish_reason or self.finish
        entries = self.tracker.push(ev) if self.tracker is not None else []
        text, calls = ev.text, []
        if self.tools is not None:
            text, calls = self.tools.feed(ev.text)
            if ev.finish_reason:
                more, late = self.tools.finish()
                text, calls = text + more, calls + late
            self.calls += calls
        if not text and not calls and not entries:
            return []
        return [self.shaper.chunk(text or None, logprobs=self._logprobs(entries), tool_calls=calls or None)
                if self.shaper.chat else self.shaper.chunk(text, logprobs=self._logprobs(entries))]

    def last(self, st: Stats, info: dict[str, Any], with_usage: bool) -> list[dict[str, Any]]:
        """The closing chunk(s); what the tool reader still held comes first (a reply cut before its last event)."""
        out = []
        if self.tools is not None:
            text, calls = self.tools.finish()
            self.calls += calls
            if text or calls:
                out.append(self.shaper.chunk(text or None, tool_calls=calls or None))
        finish = "tool_calls" if self.calls else self.finish
        return out + self.shaper.last(finish, st, info, with_usage)

    def _logprobs(self, entries: list[Entry]) -> dict[str, Any] | None:
        if self.tracker is None:
            return None
        if self.shaper.chat:
            return self.tracker.chat(entries)
        return self.tracker.completion(entries, self.base)
