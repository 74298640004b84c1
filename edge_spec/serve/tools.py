"""Tool calling on ``/v1/chat/completions``: the request's ``tools`` / ``tool_choice``, tool messages in the history,
and the reply's calls as OpenAI ``tool_calls`` (whole, or streamed as deltas).

The prompt is the model's own chat template rendered with the tools (edge_spec.runtime.template, verified
against ``apply_chat_template(tools=...)`` at export); the reply is read by edge_spec.runtime.tool_calls
(Hermes / Qwen2.5 ``<tool_call>`` blocks). ``tool_choice``: ``"auto"`` (the default) lets the model choose;
``"none"`` renders no tools and reads no calls (the tool history is still rendered); ``"required"`` and a
named function start the reply with the opening of a call (``<tool_call>`` and, for a named function, its
name), which is as far as a server without grammar-constrained decoding can force it: a reply that then does
not complete a valid call comes back as text with finish_reason ``"stop"``.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from edge_spec.runtime.tool_calls import ToolCall, ToolCallStream
from edge_spec.serve.errors import bad_request

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "auto", "none", "required" or "function"
    name: str | None = None  # the function, when mode is "function"


def parse_tools(data: dict[str, Any]) -> tuple[dict[str, Any], ...] | None:
    """``tools``: a list of ``{"type": "function", "function": {"name", "description"?, "parameters"?,
    "strict"?}}``; None when absent or empty. A malformed entry gets one 400 naming it."""
    raw = data.get("tools")
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise bad_request(f"'tools' must be a list of tools like {_EXAMPLE}, not a JSON {_kind(raw)}.", "tools",
                          "invalid_type")
    if len(raw) > MAX_TOOLS:
        raise bad_request(f"'tools' lists {len(raw)} tools; send at most {MAX_TOOLS}.", "tools")
    names: set[str] = set()
    out = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_request(f"{where} is not a function tool; each tool must look like {_EXAMPLE}.", where)
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-' (got "
                              f"{_clip(json.dumps(name))}).", f"{where}.function.name")
        if name in names:
            raise bad_request(f"{where}.function.name '{name}' is given twice; tool names must be unique.",
                              f"{where}.function.name")
        names.add(name)
        if "description" in fn and not isinstance(fn["description"], (str, type(None))):
            raise bad_request(f"{where}.function.description must be a string.", f"{where}.function.description",
                              "invalid_type")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise bad_request(f"{where}.function.parameters must be a JSON Schema object like {{\"type\": \"object\", "
                              "\"properties\": {...}}.", f"{where}.function.parameters")
        if params is not None and not isinstance(params.get("properties", {}), dict):
            raise bad_request(f"{where}.function.parameters.properties must be an object mapping each argument to "
                              "its schema.", f"{where}.function.parameters")
        if "strict" in fn and not isinstance(fn["strict"], (bool, type(None))):
            raise bad_request(f"{where}.function.strict must be true or false.", f"{where}.function.strict",
                              "invalid_type")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return tuple(out)


def parse_tool_choice(data: dict[str, Any], tools: tuple[dict[str, Any], ...] | None) -> ToolChoice:
    """``tool_choice``: "auto" | "none" | "required" | {"type": "function", "function": {"name": N}}."""
    raw = data.get("tool_choice")
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if raw in ("auto", "none"):
        return ToolChoice(raw if tools else "none")
    if not tools:
        raise bad_request("tool_choice asks for a tool call but the request has no 'tools'; send tools with it.",
                          "tool_choice")
    if raw == "required":
        return ToolChoice("required")
    names = [t["function"]["name"] for t in tools]
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        if name in names:
            return ToolChoice("function", name)
        raise bad_request(f"tool_choice names the function {_clip(json.dumps(name))}, which is not in 'tools' "
                          f"({', '.join(names)}).", "tool_choice")
    raise bad_request("tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                      "{\"name\": \"...\"}}.", "tool_choice")


def parse_parallel(data: dict[str, Any]) -> bool:
    value = data.get("parallel_tool_calls")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise bad_request("parallel_tool_calls must be true or false.", "parallel_tool_calls", "invalid_type")
    return value


def tool_message(m: dict[str, Any], where: str, content: str) -> dict[str, Any]:
    """A ``role: "tool"`` message: its content (the tool's result) and, if given, ``tool_call_id`` / ``name``."""
    out: dict[str, Any] = {"role": "tool", "content": content}
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise bad_request(f"{where}.{key} must be a string.", f"{where}.{key}", "invalid_type")
            out[key] = m[key]
    return out


def assistant_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` (OpenAI's form: arguments as JSON text holding an object)."""
    where = f"{where}.tool_calls"
    if not isinstance(raw, list):
        raise bad_request(f"{where} must be a list of calls.", where, "invalid_type")
    calls = []
    for j, call in enumerate(raw):
        at = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{at} must look like {{\"id\": \"call_1\", \"type\": \"function\", \"function\": "
                              "{\"name\": \"...\", \"arguments\": \"{...}\"}}.", at)
        args = fn.get("arguments", "{}")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise bad_request(f"{at}.function.arguments must be a JSON object encoded as a string, like "
                              "'{\"city\": \"Paris\"}'.", f"{at}.function.arguments")
        out = {"type": "function", "function": {"name": fn["name"], "arguments": json.dumps(parsed,
                                                                                             ensure_ascii=False)}}
        if isinstance(call.get("id"), str):
            out["id"] = call["id"]
        calls.append(out)
    return calls


def check_supported(engine: Any, messages: tuple[dict[str, Any], ...], tools: Any) -> None:
    """400 when the request needs tools (tools, or tool messages in its history) and the model's template has none."""
    if getattr(engine, "supports_tools", False):
        return
    chat = engine.manifest.tokenizer.chat
    why = "was exported before edge-spec checked tool templates (re-export it to use tools)" \
        if chat is not None and engine.manifest.version < 10 else "does not support tools"
    if tools:
        raise bad_request(f"This model's chat template {why}; send the request without 'tools'.", "tools",
                          "unsupported_parameter")
    for i, m in enumerate(messages):
        if m["role"] == "tool" or m.get("tool_calls"):
            what = "role" if m["role"] == "tool" else "tool_calls"
            raise bad_request(f"messages[{i}] is a tool {'result' if what == 'role' else 'call'}, but this model's "
                              f"chat template {why}.", f"messages[{i}].{what}")


def reply_prefix(choice: ToolChoice) -> str:
    """What the reply is started with to force a call (module docstring); "" for auto and none."""
    if choice.mode == "function":
        return f'<tool_call>\n{{"name": "{choice.name}", "arguments": '
    if choice.mode == "required":
        return '<tool_call>\n{"name": "'
    return ""


def call_objects(calls: list[ToolCall], start: int = 0) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls`` entries (with ``index``, as in streamed deltas; clients ignore it in whole replies)."""
    return [{"index": start + i, "id": f"call_{secrets.token_hex(12)}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]


class ToolReply:
    """Reads one reply (prefix + streamed text) into content pieces and calls; ``parallel`` False keeps the first
    call only; ``names``: the request's tool names."""

    def __init__(self, prefix: str, parallel: bool, names: frozenset[str] | None = None) -> None:
        self.stream, self.parallel, self.calls = ToolCallStream(names), parallel, 0
        self._pending = self.stream.feed(prefix)

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """-> (content to send now, tool_calls deltas to send now)."""
        return self._split(self._pending + self.stream.feed(text))

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        return self._split(self.stream.finish())

    def _split(self, pieces: list[str | ToolCall]) -> tuple[str, list[dict[str, Any]]]:
        self._pending = []
        content = "".join(p for p in pieces if isinstance(p, str))
        calls = [p for p in pieces if isinstance(p, ToolCall)]
        if not self.parallel:
            calls = calls[:max(0, 1 - self.calls)]
        objs = call_objects(calls, self.calls)
        self.calls += len(calls)
        return content, objs


_EXAMPLE = '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", ...}}}'


def _kind(x: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(x), "number")


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."

