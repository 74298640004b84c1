"""Request bodies -> typed requests, refusing anything invalid with an OpenAI-style 4xx.

Validation is by hand rather than by a schema library so that every refusal names the
parameter (``param``) and says in one sentence what was wrong and what is accepted. Unknown
fields are ignored, as OpenAI-compatible servers do (clients send vendor extensions); known
OpenAI features this server does not implement (penalties, n > 1, ...) are refused when a request
asks for them, never silently dropped. Tools and logprobs are read by serve/tools.py and serve/logprobs.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from edge_spec.serve import logprobs as lp
from edge_spec.serve import tools as tl
from edge_spec.serve.errors import APIError, bad_request

ROLES = ("system", "user", "assistant", "tool")  # "developer" (OpenAI's newer name for system) is read as system
MAX_STOP = 16


@dataclass(frozen=True)
class Sampling:
    """What both endpoints share: how much to generate and how to sample it."""

    max_tokens: int | None  # None: until a stop token or the context is full
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with usage


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict[str, Any], ...]
    sampling: Sampling
    logprobs: int | None = None  # alternatives per token (top_logprobs) when logprobs is true; None: off
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: tl.ToolChoice = tl.ToolChoice("none")
    parallel_tool_calls: bool = True


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    sampling: Sampling
    logprobs: int | None = None  # alternatives per token; None: off


# name -> (is the value the default, i.e. harmless?, what to say). Anything else asked for is refused.
_UNSUPPORTED_COMMON: dict[str, tuple[Any, str]] = {
    "n": (lambda v: v is None or (_is_int(v) and v == 1), "n must be 1: this server generates one choice per "
                                                          "request (send n requests instead)"),
    "frequency_penalty": (lambda v: v in (None, 0), "frequency_penalty is not supported (only 0); it would change "
                                                    "what the target model writes"),
    "presence_penalty": (lambda v: v in (None, 0), "presence_penalty is not supported (only 0); it would change what "
                                                   "the target model writes"),
    "logit_bias": (lambda v: v in (None, {}), "logit_bias is not supported by this server"),
}
_UNSUPPORTED_CHAT: dict[str, tuple[Any, str]] = {
    "functions": (lambda v: v in (None, []), "functions (the old form of function calling) are not supported; "
                                             "send them as 'tools'"),
    "function_call": (lambda v: v in (None, "none", "auto"), "function_call (the old form of tool_choice) is not "
                                                             "supported; send 'tool_choice'"),
    "response_format": (lambda v: v is None or v == {"type": "text"}, "response_format other than "
                                                                      "{\"type\": \"text\"} is not supported"),
    "audio": (lambda v: v is None, "audio output is not supported by this server"),
    "modalities": (lambda v: v in (None, ["text"]), "only the text modality is supported"),
}
_UNSUPPORTED_COMPLETION: dict[str, tuple[Any, str]] = {
    "echo": (lambda v: v in (None, False), "echo is not supported by this server"),
    "best_of": (lambda v: v is None or (_is_int(v) and v == 1), "best_of must be 1 on this server"),
}


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start}); "
                          "send JSON encoded as UTF-8.", code="invalid_encoding") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                          "send a JSON object such as {\"model\": \"demo\", \"messages\": [...]}.",
                          code="invalid_json") from None
    except (ValueError, RecursionError):  # nesting too deep, or an integer with thousands of digits
        raise bad_request("The request body is not JSON this server can read (nested too deeply or a number too "
                          "long); send a JSON object.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, not a JSON {_kind(data)}.", code="invalid_json")
    return data


def chat_request(data: dict[str, Any], models: tuple[str, ...], max_context: int) -> ChatRequest:
    """Validate a ``POST /v1/chat/completions`` body."""
    _check_model(data, models)
    _refuse_unsupported(data, {**_UNSUPPORTED_COMMON, **_UNSUPPORTED_CHAT})
    if "messages" not in data or data["messages"] is None:
        raise bad_request("'messages' is required: a list like [{\"role\": \"user\", \"content\": \"Hello\"}].",
                          "messages", "missing_required_parameter")
    raw = data["messages"]
    if not isinstance(raw, list):
        raise bad_request(f"'messages' must be a list of messages, not a JSON {_kind(raw)}.", "messages",
                          "invalid_type")
    if not raw:
        raise bad_request("'messages' is empty; send at least one message.", "messages", "invalid_value")
    messages = tuple(_message(m, i) for i, m in enumerate(raw))
    tools = tl.parse_tools(data)
    return ChatRequest(messages, _sampling(data, max_context), lp.chat_logprobs(data), tools,
                       tl.parse_tool_choice(data, tools), tl.parse_parallel(data))


def completion_request(data: dict[str, Any], models: tuple[str, ...], max_context: int) -> CompletionRequest:
    """Validate a ``POST /v1/completions`` body (one prompt string)."""
    _check_model(data, models)
    _refuse_unsupported(data, {**_UNSUPPORTED_COMMON, **_UNSUPPORTED_COMPLETION})
    if "prompt" not in data or data["prompt"] is None:
        raise bad_request("'prompt' is required: the text to complete.", "prompt", "missing_required_parameter")
    prompt = data["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of one
    if not isinstance(prompt, str):
        raise bad_request(f"'prompt' must be one string (this server completes one prompt per request), not a "
                          f"JSON {_kind(prompt)}.", "prompt", "invalid_type")
    if not prompt:
        raise bad_request("'prompt' is empty; send some text to complete.", "prompt", "invalid_value")
    return CompletionRequest(prompt, _sampling(data, max_context), lp.completion_logprobs(data))


# ------------------------------------------------------------------------------ parts
def _check_model(data: dict[str, Any], models: tuple[str, ...]) -> None:
    model = data.get("model")
    if model is None:
        return  # one model is served: a request that names none gets it
    served = " or ".join(f"'{m}'" for m in models)
    if not isinstance(model, str):
        raise bad_request(f"'model' must be a string ({served}), not a JSON {_kind(model)}.", "model", "invalid_type")
    if model not in models:
        raise APIError(404, f"The model '{_clip(model)}' is not served here; this server serves {served}.",
                       param="model", code="model_not_found")


def _refuse_unsupported(data: dict[str, Any], table: dict[str, tuple[Any, str]]) -> None:
    for name, (is_default, why) in table.items():
        if name in data and not is_default(data[name]):
            raise bad_request(f"{why} (got {name}={_clip(json.dumps(data[name]))}).", name, "unsupported_parameter")


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object like {{\"role\": \"user\", \"content\": \"Hello\"}}, not a "
                          f"JSON {_kind(m)}.", where, "invalid_type")
    role = m.get("role")
    if role == "developer":
        role = "system"
    if not isinstance(role, str) or role not in ROLES:
        got = "missing" if role is None else f"'{_clip(role)}'" if isinstance(role, str) else f"a JSON {_kind(role)}"
        raise bad_request(f"{where}.role is {got}; this server accepts the roles {', '.join(ROLES)}.",
                          f"{where}.role", "invalid_value")
    calls = m.get("tool_calls") if role == "assistant" else None
    content = _content(m.get("content"), f"{where}.content", "assistant" if calls else role)
    if role == "tool":  # a tool's result (its text may be empty)
        return tl.tool_message(m, where, content)
    if calls:  # an assistant message calling tools (content may be null)
        return {"role": role, "content": content or None, "tool_calls": tl.assistant_calls(calls, where)}
    if not content and role != "assistant":  # an empty reply can be real history; an empty question cannot
        raise bad_request(f"{where}.content is empty; a {role} message needs some text.", f"{where}.content",
                          "invalid_value")
    return {"role": role, "content": content}


def _content(c: Any, where: str, role: str) -> str:
    if c is None:
        if role in ("assistant", "tool"):
            return ""
        raise bad_request(f"{where} is required for a {role} message.", where, "missing_required_parameter")
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts: [{"type": "text", "text": "..."}, ...]
        texts = []
        for j, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}[{j}] is not a text part; this server reads only parts like "
                                  "{\"type\": \"text\", \"text\": \"...\"}.", f"{where}[{j}]", "invalid_value")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{where} must be a string (or a list of text parts), not a JSON {_kind(c)}.", where,
                      "invalid_type")


def _sampling(data: dict[str, Any], max_context: int) -> Sampling:
    max_tokens = _max_tokens(data, max_context)
    temperature = _number(data, "temperature", 1.0, 0.0, 2.0, "a number in [0, 2] (0 = greedy)")
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0, "a number in (0, 1] (1 = off)", low_open=True)
    min_p = _number(data, "min_p", 0.0, 0.0, 1.0, "a number in [0, 1) (0 = off)", high_open=True)  # llama.cpp's
    top_k = data.get("top_k")  # not OpenAI's, but common among local servers
    if top_k is None:
        top_k = 0
    elif not _is_int(top_k) or top_k < 0:
        raise bad_request(f"top_k must be a whole number >= 0 (0 = off), not {_clip(json.dumps(top_k))}.", "top_k")
    seed = data.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise bad_request(f"seed must be a whole number in [0, 2^63), not {_clip(json.dumps(seed))}.", "seed")
    stream = data.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"stream must be true or false, not {_clip(json.dumps(stream))}.", "stream", "invalid_type")
    opts = data.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
            raise bad_request("stream_options must be an object like {\"include_usage\": true}.", "stream_options",
                              "invalid_type")
        include_usage = opts.get("include_usage", False)
    return Sampling(max_tokens, temperature, top_p, top_k, min_p, seed, _stop(data.get("stop")), stream,
                    include_usage)


def _max_tokens(data: dict[str, Any], max_context: int) -> int | None:
    given = {k: data[k] for k in ("max_completion_tokens", "max_tokens") if data.get(k) is not None}
    if len(given) == 2 and given["max_tokens"] != given["max_completion_tokens"]:
        raise bad_request("max_tokens and max_completion_tokens differ; send one of them.", "max_tokens")
    if not given:
        return None
    name, value = next(iter(given.items()))
    if not _is_int(value):
        raise bad_request(f"{name} must be a whole number, not {_clip(json.dumps(value))}.", name, "invalid_type")
    if value < 1:
        raise bad_request(f"{name} must be at least 1, not {value}.", name)
    if value > max_context:
        raise bad_request(f"{name} is {value} but this server's context holds {max_context} tokens (prompt and "
                          f"reply together); ask for at most {max_context}.", name)
    return int(value)


def _number(data: dict[str, Any], name: str, default: float, low: float, high: float, wanted: str,
            low_open: bool = False, high_open: bool = False) -> float:
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{name} must be {wanted}, not a JSON {_kind(value)}.", name, "invalid_type")
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and \
        (value < high if high_open else value <= high)
    if not ok:
        raise bad_request(f"{name} must be {wanted}, not {value}.", name)
    return float(value)


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop must be a string or a list of strings.", "stop", "invalid_type")
    if len(items) > MAX_STOP or any(not s for s in items):
        raise bad_request(f"stop takes at most {MAX_STOP} non-empty strings.", "stop")
    return tuple(items)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _kind(x: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(x), "number")


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."
