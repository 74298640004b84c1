"""Fill-in-the-middle over HTTP: llama-server's ``POST /infill`` (request and answer shapes) and OpenAI's ``suffix``.

Editor plugins (llama.vscode, llama.vim, ...) send the text before and after the cursor as
``input_prefix`` / ``input_suffix``, other files as ``input_extra`` = [{"filename", "text"}], and
``prompt`` (text the middle starts with), plus llama-server's ``/completion`` options: ``n_predict``
(or ``max_tokens``), ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed`` (-1: random), ``stop``,
``stream``, with llama-server's defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05), and its two stops for
editors, ``n_indent`` (a line after the first with less indentation ends the middle, cut after that
indentation) and ``t_max_predict_ms`` (after that long, the next line break ends it), with llama-server's
semantics (runtime/stops.py). Options that only steer llama-server's own scheduling (``cache_prompt``,
``id_slot``, ``samplers``, ``n_cmpl``, ``response_fields``) are ignored, as is ``t_max_prompt_ms``, which
llama-server ignores too; ones that would change what the model writes and are not implemented (penalties,
grammars, ``n_probs``, ``return_tokens``) are refused by name. The answer is llama-server's: ``content``,
``stop``, ``stop_type``, ``tokens_predicted``, ``tokens_evaluated``, ``timings``, ...; streamed, one ``data:``
event per piece and a last one with ``"stop": true`` (no ``[DONE]``, as llama-server).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from edge_spec.runtime.config import Stats, StreamEvent
from edge_spec.runtime.fim import ExtraFile
from edge_spec.serve.errors import APIError, bad_request
from edge_spec.serve.requests import Sampling, _check_model, _clip, _is_int, _kind, _sampling
from edge_spec.serve.responses import cached_tokens, edge_spec_figures

# llama-server's sampling defaults (common/common.h), which /infill clients rely on
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# name -> (is the value harmless?, why it is refused)
_REFUSED: dict[str, tuple[Any, str]] = {
    "n_probs": (lambda v: v in (None, 0), "n_probs (token probabilities) is not supported by this server"),
    "return_tokens": (lambda v: v in (None, False), "return_tokens is not supported by this server"),
    "repeat_penalty": (lambda v: v in (None, 1, 1.0), "repeat_penalty is not supported (only 1); it would change "
                                                       "what the target model writes"),
    "frequency_penalty": (lambda v: v in (None, 0), "frequency_penalty is not supported (only 0)"),
    "presence_penalty": (lambda v: v in (None, 0), "presence_penalty is not supported (only 0)"),
    "logit_bias": (lambda v: v in (None, [], {}), "logit_bias is not supported by this server"),
    "grammar": (lambda v: v in (None, ""), "grammar is not supported by this server"),
    "json_schema": (lambda v: v in (None, {}), "json_schema is not supported by this server"),
}


@dataclass(frozen=True)
class InfillRequest:
    prefix: str
    suffix: str
    extra: tuple[ExtraFile, ...]
    prompt: str  # text the middle starts with (its special tokens are parsed, as llama-server does)
    sampling: Sampling
    n_indent: int = 0  # llama-server's stops for editors (0: off)
    t_max_predict_ms: int = 0


def infill_request(data: dict[str, Any], models: tuple[str, ...], max_context: int) -> InfillRequest:
    """Validate a ``POST /infill`` body (llama-server's fields and defaults, module docstring)."""
    _check_model(data, models)
    for name, (harmless, why) in _REFUSED.items():
        if name in data and not harmless(data[name]):
            raise bad_request(f"{why} (got {name}={_clip(json.dumps(data[name]))}).", name, "unsupported_parameter")
    texts = {}
    for name in ("input_prefix", "input_suffix", "prompt"):
        value = data.get(name)
        if value is None and name != "prompt":
            raise bad_request(f"'{name}' is required: the text {'before' if name == 'input_prefix' else 'after'} "
                              "the cursor (it may be empty).", name, "missing_required_parameter")
        if value is not None and not isinstance(value, str):
            raise bad_request(f"'{name}' must be a string, not a JSON {_kind(value)}.", name, "invalid_type")
        texts[name] = value or ""
    sampling = dict(DEFAULTS)
    sampling.update({k: v for k, v in data.items() if v is not None})
    n_predict = data.get("n_predict")
    if n_predict is not None:
        if not _is_int(n_predict) or n_predict == 0 or n_predict < -1 or n_predict > max_context:
            raise bad_request(f"n_predict must be -1 (until a stop) or a whole number in [1, {max_context}] (this "
                              f"server's context), not {_clip(json.dumps(n_predict))}.", "n_predict")
        if n_predict > 0:
            if data.get("max_tokens") not in (None, n_predict):
                raise bad_request("n_predict and max_tokens differ; send one of them.", "n_predict")
            sampling["max_tokens"] = n_predict
    if sampling.get("seed") == -1:  # llama-server's "random"
        del sampling["seed"]
    return InfillRequest(texts["input_prefix"], texts["input_suffix"], _extra(data.get("input_extra")),
                         texts["prompt"], _sampling(sampling, max_context), _whole(data, "n_indent", 0),
                         max(0, _whole(data, "t_max_predict_ms", -1)))


def _whole(data: dict[str, Any], name: str, low: int) -> int:
    """``data[name]`` as llama-server takes it: a whole number in [``low``, 2^31) (absent or null: 0, off)."""
    value = data.get(name)
    if value is None:
        return 0
    if not _is_int(value) or not low <= value < 2**31:
        what = {"n_indent": "the spaces or tabs each line after the first needs; 0 = off",
                "t_max_predict_ms": "milliseconds; 0 or -1 = off"}[name]
        raise bad_request(f"{name} must be a whole number >= {low} ({what}), not {_clip(json.dumps(value))}.", name)
    return int(value)


def _extra(raw: Any) -> tuple[ExtraFile, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request(f"'input_extra' must be an array of {{\"filename\": string, \"text\": string}}, not a JSON "
                          f"{_kind(raw)}.", "input_extra", "invalid_type")
    out = []
    for i, chunk in enumerate(raw):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise bad_request(f"{where} must be an object with a string \"text\" (and optionally \"filename\").",
                              where, "invalid_type")
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise bad_request(f"{where}.filename must be a string, not a JSON {_kind(name)}.", f"{where}.filename",
                              "invalid_type")
        out.append(ExtraFile(chunk["text"], name))
    return tuple(out)


def completion_suffix(data: dict[str, Any]) -> str | None:
    """The ``suffix`` of a ``/v1/completions`` body: the text after the insertion (None or "": a plain completion)."""
    suffix = data.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad_request(f"'suffix' must be a string (the text after the completion), not a JSON {_kind(suffix)}.",
                          "suffix", "invalid_type")
    return suffix or None


def no_fim(param: str, message: str) -> APIError:
    """The 400 for a fill-in-the-middle request to a model without FIM tokens."""
    return bad_request(message, param, "fim_not_supported")


def timed(events: Iterator[StreamEvent], info: dict[str, Any]) -> Iterator[StreamEvent]:
    """``events`` unchanged; notes in ``info["first_seconds"]`` when the first one came (the prompt was read and
    the first token made: llama-server's prompt time). Closing it closes ``events`` (the engine rewinds)."""
    start = time.perf_counter()
    try:
        for i, event in enumerate(events):
            if i == 0:
                info["first_seconds"] = time.perf_counter() - start
            yield event
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


# the engine's finish reasons -> llama-server's stop_type (its indentation and time stops are "limit" too)
STOP_TYPE = {"stop_token": "eos", "stop_string": "word", "length": "limit", "context_full": "limit",
             "indent": "limit", "time_limit": "limit"}


class InfillShaper:
    """llama-server's answer bodies for /infill (the ``Shaper`` interface the app's bridge uses)."""

    chat = False
    sse_done = False  # llama-server's own (non-OpenAI) streams end with the "stop": true event, no [DONE]

    def __init__(self, model: str, mode: str, sampling: Sampling) -> None:
        self.model, self.mode, self.sampling = model, mode, sampling

    def whole(self, text: str, finish: str, st: Stats, info: dict[str, Any], **_: Any) -> dict[str, Any]:
        """The answer body (``**_``: the OpenAI shapes' logprobs / tool_calls, which /infill has not)."""
        return {**self._final(st, info, finish), "content": text, "has_new_line": "\n" in text}

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False,
              **_: Any) -> dict[str, Any]:
        return {"index": 0, "content": text or "", "tokens": [], "stop": False, "id_slot": 0}

    def last(self, finish: str, st: Stats, info: dict[str, Any], with_usage: bool) -> list[dict[str, Any]]:
        return [{**self._final(st, info, finish), "content": ""}]

    def _final(self, st: Stats, info: dict[str, Any], finish: str) -> dict[str, Any]:
        info = dict(info)
        prompt, first = info.pop("prompt", ""), info.pop("first_seconds", st.seconds)
        s = self.sampling
        decode_ms = max(st.seconds - first, 0.0) * 1000
        prefilled = st.prompt_tokens - cached_tokens(st)
        return {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": self.model,
                "tokens_predicted": st.tokens, "tokens_evaluated": st.prompt_tokens,
                "generation_settings": {"n_predict": s.max_tokens or -1, "temperature": s.temperature,
                                        "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                                        "seed": -1 if s.seed is None else s.seed, "stop": list(s.stop),
                                        "stream": s.stream},
                "prompt": prompt, "has_new_line": False, "truncated": False,
                "stop_type": STOP_TYPE.get(finish, "limit"), "stopping_word": "", "tokens_cached": cached_tokens(st),
                "timings": {"prompt_n": prefilled, "prompt_ms": first * 1000,
                            "prompt_per_token_ms": first * 1000 / prefilled if prefilled else 0.0,
                            "prompt_per_second": prefilled / first if first else 0.0,
                            "predicted_n": st.tokens, "predicted_ms": decode_ms,
                            "predicted_per_token_ms": decode_ms / st.tokens if st.tokens else 0.0,
                            "predicted_per_second": st.tokens * 1000 / decode_ms if decode_ms else 0.0},
                "edge_spec": edge_spec_figures(st, info, self.mode)}

