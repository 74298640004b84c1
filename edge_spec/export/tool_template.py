"""Check, at export, that the runtime's Jinja rendering of tool conversations equals ``apply_chat_template(tools=)``.

The flattened format (chat_template.py) cannot express tools: their JSON goes into the system block and
assistant messages carry calls. For those conversations the runtime renders the template itself
(``edge_spec.runtime.template``); here both renderings are compared token for token on a fixed set of tool
conversations (tools with and without a system message, a call and its result, parallel calls, a follow-up
turn, unicode arguments). The count that matched goes into ``ChatFormat.tools_verified``; a template that does
not render tools in the ``<tool_call>`` syntax, or differs anywhere, gets 0 and the server refuses tools for it.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

from edge_spec.bundle import ChatFormat
from edge_spec.runtime.template import encode_template, renders_tools

Conversation = list[dict[str, Any]]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Das aktuelle Datum und die Uhrzeit (Zeitzone optional).",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}


def _call(name: str, args: dict[str, Any], i: int) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def tool_conversations() -> list[tuple[Conversation, list[dict[str, Any]] | None, bool]]:
    """(conversation, tools, add_generation_prompt) the export compares both renderings on."""
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    system = {"role": "system", "content": "You are a helpful assistant."}
    called = {"role": "assistant", "content": None, "tool_calls": [_call("get_weather", {"city": "Paris"}, 0)]}
    result = {"role": "tool", "tool_call_id": "call_0", "content": "{\"temperature\": 18, \"sky\": \"clear\"}"}
    answer = {"role": "assistant", "content": "It is 18 °C and clear in Paris."}
    two = {"role": "assistant", "content": "Let me check both.", "tool_calls": [
        _call("get_weather", {"city": "Zürich", "unit": "celsius"}, 1), _call("get_time", {"tz": "Europe/Zurich"}, 2)]}
    results = [{"role": "tool", "tool_call_id": "call_1", "content": "12 °C, Regen"},
               {"role": "tool", "tool_call_id": "call_2", "content": "2026-11-29T10:00"}]
    tools = [WEATHER, TIME]
    return [
        ([ask], tools, True),
        ([system, ask], tools, True),
        ([ask], [WEATHER], True),
        ([ask, called, result], tools, True),
        ([system, ask, called, result, answer], tools, False),
        ([ask, called, result, answer, {"role": "user", "content": "And in Zürich, with the time?"}, two, *results],
         tools, True),
        ([ask, called, result], None, True),  # a tool history without tools on offer (tool_choice "none")
    ]


def template_variables(tok: Any) -> dict[str, str]:
    """The special-token strings ``apply_chat_template`` passes the template (``tokenizer.special_tokens_map``)."""
    raw = getattr(tok, "special_tokens_map", None) or {}
    return {str(k): str(v) for k, v in raw.items() if isinstance(v, str)}


def with_tools(tok: Any, runtime_tokenizer: Any, fmt: ChatFormat) -> ChatFormat:
    """``fmt`` with ``variables`` and ``tools_verified`` filled in (see the module docstring)."""
    fmt = replace(fmt, variables=template_variables(tok), tools_verified=0)
    if not fmt.template or not renders_tools(fmt.template, fmt.variables):
        return fmt
    checked = 0
    for conv, tools, gen in tool_conversations():
        try:
            want = tok.apply_chat_template(conv, tools=tools, tokenize=True, add_generation_prompt=gen,
                                           return_dict=False)
        except Exception:
            want = None  # the template refuses it (e.g. a tool role it does not know); the runtime must too
        try:
            got = encode_template(runtime_tokenizer, fmt, conv, tools, gen)
        except Exception:
            got = None
        if want is None and got is None:
            continue
        if hasattr(want, "tolist"):
            want = want.tolist()
        if want is None or got is None or list(want) != got:
            warnings.warn(f"The chat template renders tools, but edge-spec's rendering of a {len(conv)}-message tool "
                          "conversation differs from apply_chat_template; the bundle will refuse tools.", stacklevel=2)
            return fmt
        checked += 1
    return replace(fmt, tools_verified=checked)
