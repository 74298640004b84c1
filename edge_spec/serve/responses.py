"""Response bodies shaped as the OpenAI API documents them, plus edge-spec's own figures.

``usage`` carries prompt/completion tokens and, as OpenAI does for its prompt cache,
``prompt_tokens_details.cached_tokens``: here the prompt tokens whose KV was kept from the
previous request. edge-spec's figures (drafts, acceptance, lookup share, speed, prefilled
tokens, dropped turns) go into an extra top-level ``edge_spec`` object that clients ignore.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from edge_spec.runtime.config import Stats

# the engine's finish reasons -> OpenAI's
FINISH = {"stop_token": "stop", "stop_string": "stop", "length": "length", "context_full": "length",
          "tool_calls": "tool_calls"}  # the last one: the server's, when the reply called tools


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def cached_tokens(st: Stats) -> int:
    """Prompt tokens whose KV was kept from the previous request. The prompt's last token is always read again
    (its logits give the first new token), so at most prompt_tokens - 1 even when the whole prompt matched."""
    return min(st.reused_tokens, max(st.prompt_tokens - 1, 0))


def usage(st: Stats) -> dict[str, Any]:
    return {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.tokens,
            "total_tokens": st.prompt_tokens + st.tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens(st)}}


def edge_spec_figures(st: Stats, info: dict[str, Any], mode: str) -> dict[str, Any]:
    """What speculation did for this request (clients that do not know the field ignore it)."""
    return {"mode": mode, "drafted": st.drafted, "accepted": st.accepted,
            "acceptance_rate": round(st.acceptance_rate, 4),
            "lookup_share": round(st.lookup_drafted / st.drafted, 4) if st.drafted else 0.0,
            "tokens_per_second": round(st.tokens_per_second, 2), "target_passes": st.target_passes,
            "prefilled_tokens": st.prompt_tokens - cached_tokens(st), "reused_tokens": cached_tokens(st),
            "seconds": round(st.seconds, 4), **info}


class Shaper:
    """Builds the bodies of one request (same id, created time and model name in every chunk)."""

    sse_done = True  # OpenAI streams end with "data: [DONE]"

    def __init__(self, chat: bool, model: str, mode: str) -> None:
        self.chat, self.model, self.mode = chat, model, mode
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish: str, st: Stats, info: dict[str, Any], *,
              logprobs: dict[str, Any] | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The non-streaming body (``logprobs``: serve/logprobs.py's shape; ``tool_calls``: serve/tools.py's)."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
            choice = {"index": 0, "message": message, "logprobs": logprobs,
                      "finish_reason": FINISH.get(finish, "stop")}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": FINISH.get(finish, "stop")}
            body = self._head("text_completion")
        return {**body, "choices": [choice], "usage": usage(st), "edge_spec": edge_spec_figures(st, info, self.mode)}

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False, *,
              logprobs: dict[str, Any] | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One streamed chunk: a text delta (and/or tool-call deltas, logprobs), or the last one with
        ``finish_reason``."""
        reason = FINISH.get(finish, "stop") if finish else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def last(self, finish: str, st: Stats, info: dict[str, Any], with_usage: bool) -> list[dict[str, Any]]:
        """The closing chunk (finish_reason + edge-spec figures) and, if asked for, the usage chunk."""
        end = {**self.chunk(finish=finish), "edge_spec": edge_spec_figures(st, info, self.mode)}
        if not with_usage:
            return [end]
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return [end, {**self._head(obj), "choices": [], "usage": usage(st)}]


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
