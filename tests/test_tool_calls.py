"""Tool calls (issue 46): the Hermes / Qwen2.5 ``<tool_call>`` reader on fixed strings, the runtime's Jinja rendering
against transformers' ``apply_chat_template(tools=...)``, and the export's check that records it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from edge_spec.export import tool_template
from edge_spec.export.chat_template import chat_format
from edge_spec.runtime import template
from edge_spec.runtime.tool_calls import ToolCall, ToolCallStream, parse_call, parse_tool_calls

ROOT = Path(__file__).resolve().parents[1]
QWEN_TEMPLATE = (ROOT / "tests" / "data" / "qwen2.5_chat_template.jinja").read_text(encoding="utf-8")
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

# reply -> (content, calls)
CASES = [
    (WEATHER_CALL, ("", [ToolCall("get_weather", '{"city": "Paris"}')])),
    ("Let me check.\n" + WEATHER_CALL, ("Let me check.", [ToolCall("get_weather", '{"city": "Paris"}')])),
    (WEATHER_CALL + "\n" + WEATHER_CALL.replace("Paris", "Zürich"),
     ("", [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_weather", '{"city": "Zürich"}')])),
    # arguments given as a JSON string, or under "parameters"; absent arguments are {}
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>', ("", [ToolCall("f", '{"x": [1, 2]}')])),
    ('<tool_call>{"name": "f", "parameters": {"y": null}}</tool_call>', ("", [ToolCall("f", '{"y": null}')])),
    ('<tool_call>{"name": "f"}</tool_call>', ("", [ToolCall("f", "{}")])),
    # the model stopped right after the object: the unclosed block is still a call
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n', ("", [ToolCall("f", '{"a": 1}')])),
    # not calls: the text stays as written
    ("Sure.\n<tool_call>not json</tool_call> done", ("Sure.\n<tool_call>not json</tool_call> done", [])),
    ('<tool_call>{"arguments": {}}</tool_call>', ('<tool_call>{"arguments": {}}</tool_call>', [])),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [])),
    ('cut <tool_call>{"name": "f", "argu', ('cut <tool_call>{"name": "f", "argu', [])),
    ("Hello <toolbox> and <tool_calls> stay text  \n", ("Hello <toolbox> and <tool_calls> stay text  \n", [])),
    ("", ("", [])),
]


@pytest.mark.parametrize("text,want", CASES)
def test_parse_tool_calls_on_fixed_replies(text: str, want: tuple[str, list[ToolCall]]) -> None:
    assert parse_tool_calls(text) == want


@pytest.mark.parametrize("text,want", CASES)
@pytest.mark.parametrize("step", [1, 3, 7])
def test_a_streamed_reply_reads_as_the_whole_one(text: str, want: tuple[str, list[ToolCall]], step: int) -> None:
    stream = ToolCallStream()
    pieces = []
    for i in range(0, len(text), step):
        pieces += stream.feed(text[i:i + step])
    pieces += stream.finish()
    assert ("".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCall)]) == want


FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```'
# with the request's tool names: a ```json block naming one of them is a call too (as llama-server reads it)
NAMED = [
    (FENCED, ("", [ToolCall("get_weather", '{"city": "Paris"}')])),
    ("Calling it:\n" + FENCED + "\nDone.", ("Calling it:Done.", [ToolCall("get_weather", '{"city": "Paris"}')])),
    (FENCED.replace("get_weather", "get_time"), (FENCED.replace("get_weather", "get_time"), [])),  # not offered
    ('An example:\n```json\n{"a": 1}\n```\n```python\nx = 1\n```', (
        'An example:\n```json\n{"a": 1}\n```\n```python\nx = 1\n```', [])),
    (WEATHER_CALL, ("", [ToolCall("get_weather", '{"city": "Paris"}')])),
    ('<tool_call>{"name": "anything"}</tool_call>', ("", [ToolCall("anything", "{}")])),  # the tag says it is a call
    ("```js and ```jso", ("```js and ```jso", [])),
]


@pytest.mark.parametrize("text,want", NAMED)
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_fenced_json_calls_count_only_for_offered_tools(text: str, want: tuple[str, list[ToolCall]],
                                                        step: int) -> None:
    names = frozenset({"get_weather"})
    stream = ToolCallStream(names)
    pieces = []
    for i in range(0, len(text), step):
        pieces += stream.feed(text[i:i + step])
    pieces += stream.finish()
    got = ("".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCall)])
    assert got == want == parse_tool_calls(text, names)
    assert parse_tool_calls(FENCED) == (FENCED, [])  # without names (no tools offered) a block is text


def test_content_streams_before_the_call_and_the_call_when_it_closes() -> None:
    stream = ToolCallStream()
    assert stream.feed("Let me check") == ["Let me check"]  # nothing that could start a tag: sent at once
    assert stream.feed(".\n<tool") == ["."]  # "\n" (may precede a block) and "<tool" (may be a tag) are held
    assert stream.feed('_call>\n{"name": "get_weather", ') == []
    assert stream.feed('"arguments": {"city": "Paris"}}\n</tool_call>') == [ToolCall("get_weather",
                                                                                    '{"city": "Paris"}')]
    assert stream.feed("\n") == [] and stream.finish() == []


def test_parse_call_refuses_what_is_not_a_call() -> None:
    assert parse_call('{"name": "f", "arguments": {"a": "é"}}') == ToolCall("f", '{"a": "é"}')
    for body in ("", "[]", '{"name": 3}', '{"name": ""}', '{"name": "f", "arguments": "nope"}', "{" * 100000):
        assert parse_call(body) is None


# ------------------------------------------------------------------------------ rendering, as transformers does
@pytest.fixture(scope="module")
def hf_qwen():
    """The demo target's HF tokenizer with Qwen2.5's chat template (tools, tool calls, tool results)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "models" / "demo" / "target"))
    tok.chat_template = QWEN_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def runtime_tok():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ROOT / "models" / "demo" / "target" / "tokenizer.json"))


@pytest.fixture(scope="module")
def qwen_format(hf_qwen, runtime_tok):
    return tool_template.with_tools(hf_qwen, runtime_tok, chat_format(hf_qwen, runtime_tok))


def test_export_verifies_tool_conversations_for_a_template_that_renders_tools(qwen_format) -> None:
    assert qwen_format.verified > 0
    assert qwen_format.tools_verified == len(tool_template.tool_conversations()) == 7


@pytest.mark.parametrize("i", range(7))
def test_rendering_equals_apply_chat_template_with_tools(hf_qwen, qwen_format, i: int) -> None:
    conv, tools, gen = tool_template.tool_conversations()[i]
    want = hf_qwen.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=gen)
    assert template.render_template(qwen_format, conv, tools, gen) == want


def test_openai_form_arguments_render_as_the_object_they_hold(hf_qwen, qwen_format) -> None:
    conv, tools, gen = tool_template.tool_conversations()[5]
    openai_form = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
        c["function"]["arguments"], ensure_ascii=False)}} for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in conv]
    assert template.render_template(qwen_format, openai_form, tools, gen) == \
        hf_qwen.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=gen)
    bad = [conv[0], {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": "[1, 2]"}}]}]
    with pytest.raises(Exception, match="arguments that are not a JSON object"):
        template.render_template(qwen_format, bad, tools, True)


def test_the_environment_is_transformers_one(hf_qwen, qwen_format) -> None:
    """bos_token from the recorded variables, namespace, loop controls, raise_exception, tojson's options,
    {% generation %}: the same text as transformers."""
    from dataclasses import replace

    src = ("{{ eos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'tool' %}"
           "{% set ns.n = ns.n + 1 %}{% continue %}{% endif %}{% generation %}{{ m.role }}: {{ m.content }}"
           "{% endgeneration %}\n{% endfor %}{{ tools | tojson(indent=2, sort_keys=true) }} n={{ ns.n }}"
           "{% if messages | length > 9 %}{{ raise_exception('too long') }}{% endif %}")
    conv, tools, _ = tool_template.tool_conversations()[3]
    fmt = replace(qwen_format, template=src)
    want = hf_qwen.apply_chat_template(conv, tools=tools, tokenize=False, chat_template=src)
    assert template.render_template(fmt, conv, tools, False) == want and "n=1" in want
    with pytest.raises(Exception, match="refuses this conversation .*too long"):
        template.render_template(fmt, conv * 4, tools, False)


def test_templates_without_hermes_tool_calls_get_no_tool_support(hf_qwen, runtime_tok) -> None:
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(ROOT / "models" / "demo" / "target"))  # the demo's: no tools
    assert tool_template.with_tools(plain, runtime_tok, chat_format(plain, runtime_tok)).tools_verified == 0
    other = QWEN_TEMPLATE.replace("<tool_call>", "[TOOL_CALLS]").replace("</tool_call>", "[/TOOL_CALLS]")
    assert not template.renders_tools(other) and template.renders_tools(QWEN_TEMPLATE)


def test_export_records_0_and_warns_when_the_rendering_differs(hf_qwen, runtime_tok,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real = template.encode_template

    def off_by_one(tok, fmt, conv, tools, gen=True, prefix=""):
        return real(tok, fmt, conv, tools, gen, prefix) + ([1] if len(conv) > 3 else [])

    monkeypatch.setattr(tool_template, "encode_template", off_by_one)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fmt = tool_template.with_tools(hf_qwen, runtime_tok, chat_format(hf_qwen, runtime_tok))
    assert fmt.tools_verified == 0 and any("will refuse tools" in str(w.message) for w in caught)
