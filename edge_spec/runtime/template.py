"""The model's own Jinja chat template, rendered as transformers' ``apply_chat_template`` renders it, for what the
flattened format (runtime/chat.py) cannot say: a list of tools, tool results, assistant messages that call tools.

The environment is transformers' (sandboxed ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, its ``tojson`` filter, ``raise_exception``, ``strftime_now``,
``dict`` and a ``namespace`` that refuses underscore names); the variables are the messages, ``tools``,
``add_generation_prompt`` and the special-token strings the export recorded (``ChatFormat.variables``). The
export renders tool conversations both ways and records how many matched token for token
(``ChatFormat.tools_verified``); only a template with a count above 0 is used with tools.

jinja2 is imported only when a conversation needs this path (the ``serve`` extra installs it; the lean
runtime does not need it for plain chats).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from edge_spec.bundle import ChatFormat
from edge_spec.errors import EdgeSpecError

TOOL_CALL_OPEN = "<tool_call>"  # Hermes / Qwen2.5: the only tool-call syntax edge_spec.runtime.tool_calls parses


def needs_template(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> bool:
    """True when the conversation needs the Jinja template: tools are given, or a message is a tool result or an
    assistant message carrying ``tool_calls``."""
    return bool(tools) or any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
                              for m in messages)


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them (what transformers and llama.cpp pass): keys whose value is None dropped,
    and a tool call's ``function.arguments`` given as JSON text (OpenAI's form) parsed into the object templates
    print with ``tojson``. Raises :class:`EdgeSpecError` when arguments are not a JSON object."""
    out = []
    for i, m in enumerate(messages):
        m = {k: v for k, v in m.items() if v is not None}
        calls = []
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    args = None
                if not isinstance(args, dict):
                    raise EdgeSpecError(f"Message {i}'s tool call {j} has arguments that are not a JSON object; send "
                                        "them as a JSON object encoded as a string, like '{\"city\": \"Paris\"}'.")
                fn["arguments"] = args
            calls.append({**call, "function": fn})
        if calls:
            m["tool_calls"] = calls
        out.append(m)
    return out


def render_template(fmt: ChatFormat, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                    add_generation_prompt: bool = True) -> str:
    """The text ``apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...)`` gives."""
    if not fmt.template:
        raise EdgeSpecError("This bundle keeps no Jinja chat template, so it cannot render tools; re-export it.")
    jinja2 = _jinja2()
    try:
        return _compiled(fmt.template).render(messages=template_messages(messages), tools=list(tools) if tools
                                              else None, documents=None, add_generation_prompt=add_generation_prompt,
                                              **fmt.variables)
    except jinja2.TemplateError as exc:  # raise_exception() in the template, or a conversation it cannot take
        raise EdgeSpecError(f"The model's chat template refuses this conversation ({str(exc)[:200]}).") from None


def encode_template(tokenizer: Any, fmt: ChatFormat, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None, add_generation_prompt: bool = True,
                    reply_prefix: str = "") -> list[int]:
    """Token ids of :func:`render_template` (+ ``reply_prefix``, the start of the assistant's reply), encoded as
    transformers encodes a rendered chat (``add_special_tokens=False``)."""
    text = render_template(fmt, messages, tools, add_generation_prompt) + reply_prefix
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def renders_tools(template: str, variables: dict[str, str] | None = None) -> bool:
    """Whether ``template`` writes the tools it is given into the prompt (a probe tool's name appears) and uses the
    Hermes ``<tool_call>`` syntax this runtime parses."""
    if TOOL_CALL_OPEN not in template:
        return False
    probe = {"type": "function", "function": {"name": "edge_spec_probe_fn", "description": "probe",
                                              "parameters": {"type": "object", "properties": {}}}}
    jinja2 = _jinja2()
    try:
        text = _compiled(template).render(messages=[{"role": "user", "content": "hi"}], tools=[probe], documents=None,
                                          add_generation_prompt=True, **(variables or {}))
    except jinja2.TemplateError:
        return False
    return "edge_spec_probe_fn" in text


def _jinja2() -> Any:
    try:
        import jinja2
    except ImportError:
        raise EdgeSpecError("Rendering tools needs jinja2: pip install 'edge-spec[serve]' (or jinja2).") from None
    return jinja2


@lru_cache(maxsize=4)
def _compiled(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """transformers' ``{% generation %}`` block (it marks assistant tokens for training masks): its body only."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: namespace(self=...) works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # transformers' (Jinja's own escapes HTML characters)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       dict=lambda *a, **k: dict(*a, **k), namespace=Namespace)
    return env.from_string(template)
