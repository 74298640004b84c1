"""``tools`` / ``tool_choice`` on the server (issue 46), against a live server on the toy pair given Qwen2.5's chat
template (which renders tools and teaches ``<tool_call>``): the prompt is ``apply_chat_template(tools=...)`` token for
token; the reply's calls come out as OpenAI ``tool_calls`` (whole and streamed, through the ``openai`` client); bad
tools get one 400. A toy model does not call tools on its own, so the reply-shape tests script the engine's text."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge_spec.bundle import MANIFEST_NAME, read_manifest, write_manifest
from edge_spec.export import tool_template
from edge_spec.export.chat_template import chat_format
from edge_spec.runtime.config import StreamEvent
from edge_spec.runtime.engine import Engine
from edge_spec.serve import ServeConfig
from tests.test_serve import CONTEXT, NAME, LiveServer

ROOT = Path(__file__).resolve().parents[1]
WEATHER = tool_template.WEATHER
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
OK = {"model": NAME, "messages": ASK, "max_tokens": 4, "temperature": 0, "tools": [WEATHER]}


@pytest.fixture(scope="module")
def hf_qwen():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "models" / "demo" / "target"))
    tok.chat_template = (ROOT / "tests" / "data" / "qwen2.5_chat_template.jinja").read_text(encoding="utf-8")
    return tok


@pytest.fixture(scope="module")
def tools_bundle(demo_bundle: Path, hf_qwen, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo bundle (its files linked) with the chat format the export derives for Qwen2.5's template."""
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("tools-bundle")
    for f in demo_bundle.rglob("*"):
        if f.is_file() and f.name != MANIFEST_NAME:
            (out / f.relative_to(demo_bundle)).parent.mkdir(parents=True, exist_ok=True)
            (out / f.relative_to(demo_bundle)).symlink_to(f)
    m = read_manifest(demo_bundle)
    runtime_tok = Tokenizer.from_file(str(demo_bundle / m.tokenizer.files[0]))
    chat = tool_template.with_tools(hf_qwen, runtime_tok, chat_format(hf_qwen, runtime_tok))
    assert chat.tools_verified > 0
    write_manifest(out, dataclasses.replace(m, tokenizer=dataclasses.replace(m.tokenizer, chat=chat)))
    return out


@pytest.fixture(scope="module")
def served(tools_bundle: Path) -> Iterator[LiveServer]:
    live = LiveServer(Engine.load(tools_bundle, max_context=1024), ServeConfig(model_names=(NAME,)))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def plain(demo_bundle: Path) -> Iterator[LiveServer]:
    """The toy pair with its own template (no tools)."""
    live = LiveServer(Engine.load(demo_bundle, max_context=CONTEXT), ServeConfig(model_names=(NAME,)))
    yield live
    live.stop()


def _post(live: LiveServer, body: Any) -> httpx.Response:
    return httpx.post(live.url + "/v1/chat/completions", content=json.dumps(body).encode(), timeout=60)


def _prompt(live: LiveServer, got: Any) -> list[int]:
    """The prompt the engine read for the last request: its committed tokens before the reply."""
    return live.engine.context[:got.usage.prompt_tokens]


# ------------------------------------------------------------------------------ the prompt: apply_chat_template(tools)
def test_a_tools_request_prompts_with_the_template_rendered_with_the_tools(served: LiveServer, hf_qwen) -> None:
    client = served.client()
    got = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER], max_tokens=4, temperature=0)
    want = hf_qwen.apply_chat_template(ASK, tools=[WEATHER], tokenize=True, add_generation_prompt=True,
                                       return_dict=False)
    assert _prompt(served, got) == list(want) and "get_weather" in hf_qwen.decode(want)
    assert got.choices[0].finish_reason == "length" and got.choices[0].message.tool_calls is None


def test_the_tool_result_turn_renders_calls_and_results(served: LiveServer, hf_qwen) -> None:
    """The second request of a tool round trip, in OpenAI's form (arguments as JSON text, content null)."""
    client = served.client()
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18, \"sky\": \"clear\"}"}]
    got = client.chat.completions.create(model=NAME, messages=history, tools=[WEATHER], max_tokens=4, temperature=0)
    as_hf = [history[0], {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]}, history[2]]
    want = hf_qwen.apply_chat_template(as_hf, tools=[WEATHER], tokenize=True, add_generation_prompt=True,
                                       return_dict=False)
    assert _prompt(served, got) == list(want)
    text = hf_qwen.decode(want)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text and "<tool_response>" in text


def test_tool_choice_none_and_named(served: LiveServer, hf_qwen) -> None:
    client = served.client()
    none = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER], tool_choice="none",
                                          max_tokens=4, temperature=0)
    assert _prompt(served, none) == list(hf_qwen.apply_chat_template(ASK, tokenize=True, add_generation_prompt=True,
                                                                     return_dict=False))  # no tools rendered
    named = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER], max_tokens=4, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    text = hf_qwen.apply_chat_template(ASK, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": '  # the reply is started with the call's opening
    assert _prompt(served, named) == hf_qwen(text + prefix, add_special_tokens=False)["input_ids"]
    # a toy model does not finish the call: the reply comes back as text, opening included
    assert named.choices[0].message.content.startswith(prefix) and named.choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------ the reply: OpenAI tool_calls
REPLY = ["Let me", " check.\n<tool", '_call>\n{"name": "get_weather", "argu', 'ments": {"city": "Par',
         'is"}}\n</tool_call>', '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>']


def _scripted(engine: Engine, seen: list[dict[str, Any]], reply: list[str] = REPLY) -> Any:
    """engine.chat replaced by a reply of fixed text (each piece one event), after recording what it was given."""
    def chat(messages: Any, config: Any = None, *, stream: bool = False, tools: Any = None, reply_prefix: str = "",
             **kw: Any) -> Iterator[StreamEvent]:
        seen.append({"tools": tools, "reply_prefix": reply_prefix})
        ids = [engine.tokenizer.encode(p).ids for p in reply]
        return iter([StreamEvent(p, tuple(t), (False,) * len(t), "stop_token" if i == len(reply) - 1 else None)
                     for i, (p, t) in enumerate(zip(reply, ids))])
    return chat


@pytest.mark.parametrize("parallel", [True, False])
def test_calls_come_out_as_openai_tool_calls_whole_and_streamed(served: LiveServer, parallel: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(served.engine, "chat", _scripted(served.engine, seen))
    client = served.client()
    kw = dict(model=NAME, messages=ASK, tools=[WEATHER], max_tokens=64, parallel_tool_calls=parallel)
    whole = client.chat.completions.create(**kw).choices[0]
    assert seen[-1] == {"tools": (WEATHER,), "reply_prefix": ""}
    cities = ["Paris", "Lyon"] if parallel else ["Paris"]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Let me check."
    calls = whole.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [("function", "get_weather", {"city": city}) for city in cities]
    assert len({c.id for c in calls}) == len(calls) and all(c.id.startswith("call_") for c in calls)

    chunks = list(client.chat.completions.create(**kw, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert content == "Let me check."
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
        [(i, "get_weather", {"city": city}) for i, city in enumerate(cities)]
    assert all(d.id and d.type == "function" for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    first_call = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.tool_calls)
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:first_call] if c.choices) == "Let me check."


def test_a_json_block_naming_an_offered_tool_is_a_call(served: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Qwen2.5-Coder-1.5B writes for "What is the weather in Paris?" with a get_weather tool."""
    fenced = ["```json\n{\n  \"name\": \"get_weather\",\n", '  "arguments": {"city": "Paris"}\n}\n```']
    monkeypatch.setattr(served.engine, "chat", _scripted(served.engine, [], fenced))
    choice = _post(served, OK).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [{"name": "get_weather",
                                                                         "arguments": '{"city": "Paris"}'}]
    other = {**OK, "tools": [tool_template.TIME]}  # the block names a tool this request does not offer: text
    assert _post(served, other).json()["choices"][0]["message"] == {"role": "assistant", "content": "".join(fenced)}


def test_forced_calls_start_the_reply_with_the_opening(served: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(served.engine, "chat", _scripted(served.engine, seen))
    r = _post(served, {**OK, "tool_choice": "required"})
    assert r.status_code == 200 and seen[-1]["reply_prefix"] == '<tool_call>\n{"name": "'
    r = _post(served, {**OK, "tool_choice": "none"})
    assert seen[-1] == {"tools": None, "reply_prefix": ""}
    message = r.json()["choices"][0]["message"]  # "none": the text is not read for calls
    assert "tool_calls" not in message and message["content"] == "".join(REPLY)


# ------------------------------------------------------------------------------ bad input
BAD_TOOLS = [
    ("tools an object", {"tools": {"name": "f"}}, "tools"),
    ("a tool without type", {"tools": [{"function": {"name": "f"}}]}, "tools[0]"),
    ("a tool's function a string", {"tools": [{"type": "function", "function": "f"}]}, "tools[0]"),
    ("a name with spaces", {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
     "tools[0].function.name"),
    ("no name", {"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ("a name twice", {"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ("parameters a list", {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ("parameters not an object schema", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]}, "tools[0].function.parameters"),
    ("properties a list", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": ["city"]}}}]}, "tools[0].function.parameters"),
    ("tool_choice an unknown function", {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ("tool_choice a word", {"tool_choice": "always"}, "tool_choice"),
    ("tool_choice required without tools", {"tools": None, "tool_choice": "required"}, "tool_choice"),
    ("arguments not JSON", {"messages": ASK + [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": "{city: Paris}"}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ("a call without a function", {"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "x"}]}]},
     "messages[1].tool_calls[0]"),
    ("functions (the old form)", {"functions": [{"name": "f"}]}, "functions"),
]


@pytest.mark.parametrize("what,change,param", BAD_TOOLS, ids=[b[0] for b in BAD_TOOLS])
def test_bad_tools_get_one_400_and_the_next_request_is_served(served: LiveServer, what: str, change: dict[str, Any],
                                                              param: str) -> None:
    r = _post(served, {**OK, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].endswith(".") and "Traceback" not in r.text and len(error["message"]) < 300
    assert _post(served, OK).status_code == 200


def test_a_template_without_tools_refuses_them_clearly(plain: LiveServer) -> None:
    r = _post(plain, OK)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "tools" and error["code"] == "unsupported_parameter"
    assert "does not support tools" in error["message"]
    r = _post(plain, {**OK, "tools": None, "messages": ASK + [{"role": "tool", "content": "18 C"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].role"
    with pytest.raises(openai.BadRequestError):
        plain.client().chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER])
    assert _post(plain, {**OK, "tools": None}).status_code == 200
