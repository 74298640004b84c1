"""edge-spec serve (issue 16) with real clients: the official ``openai`` package and raw httpx against a real
uvicorn server on a free loopback port, serving the toy pair (the ``demo_bundle`` fixture).

In-process servers (a uvicorn thread) let a test look at the served engine (its committed context,
counters); the CLI tests start ``python -m edge_spec serve`` as a subprocess (signals, warnings)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge_spec.runtime.engine import Engine
from edge_spec.serve import ServeConfig, create_app
from edge_spec.serve.run import bind, make_server

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 256
NAME = "toy"
CHATS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "class Stack:"}],
    [{"role": "user", "content": "import os"}, {"role": "assistant", "content": "import sys"},
     {"role": "user", "content": "def main():"}],
]


class LiveServer:
    """``create_app(engine, config)`` run by uvicorn in a thread on a free loopback port (as ``edge-spec serve`` runs
    it, with a 2 s grace period when stopping)."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        self.engine = engine
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = make_server(create_app(engine, config), log_level="warning", grace=2)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/health").json()

    def idle(self) -> dict[str, Any]:
        """/health once nothing runs or waits (a cancelled job ends at its next step)."""
        deadline = time.monotonic() + 10
        while (h := self.health())["running"] or h["waiting"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return h

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(demo_bundle: Path) -> Iterator[LiveServer]:
    live = LiveServer(Engine.load(demo_bundle, max_context=CONTEXT), ServeConfig(model_names=(NAME, "demo")))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def ref(demo_bundle: Path) -> Engine:
    """A second engine on the same bundle: what ``Engine.chat`` says, to compare the server with."""
    return Engine.load(demo_bundle, max_context=CONTEXT)


@pytest.fixture()
def client(served: LiveServer) -> openai.OpenAI:
    return served.client()


def _post(live: LiveServer, path: str, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(live.url + path, content=content, timeout=30, **kw)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ------------------------------------------------------------------------------ the endpoints, greedy == Engine.chat
def test_models_and_health(served: LiveServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    health = served.health()
    assert health["status"] == "ok" and health["context"] == CONTEXT and health["mode"] == "speculative"


@pytest.mark.parametrize("messages", CHATS)
def test_chat_greedy_equals_engine_chat_token_for_token(served: LiveServer, client: openai.OpenAI, ref: Engine,
                                                        messages: list[dict[str, str]]) -> None:
    want = ref.chat(messages, max_new_tokens=24, temperature=0)
    got = client.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0)
    assert got.choices[0].message.content == want.text
    assert served.engine.context == ref.context  # the committed token ids: prompt + reply, token for token
    assert got.choices[0].finish_reason == {"stop_token": "stop", "length": "length"}[want.finish_reason]
    assert got.usage.completion_tokens == len(want.token_ids) and got.usage.prompt_tokens == len(ref.encode_chat(
        messages))
    figures = got.model_extra["edge_spec"]  # edge-spec's own figures, in a field clients ignore
    assert figures["mode"] == "speculative" and figures["drafted"] >= figures["accepted"] >= 0
    assert {"acceptance_rate", "lookup_share", "tokens_per_second", "prefilled_tokens"} <= set(figures)

    stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [got.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_completions_and_stop_strings(served: LiveServer, client: openai.OpenAI, ref: Engine) -> None:
    prompt = "def fibonacci(n):"
    want = ref.generate(prompt, max_new_tokens=32)
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=32, temperature=0)
    assert got.choices[0].text == want.text and served.engine.context == ref.context
    streamed = client.completions.create(model=NAME, prompt=prompt, max_tokens=32, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want.text
    stop = ref.generate(prompt, max_new_tokens=32, stop=["\n"])
    cut = client.completions.create(model="demo", prompt=prompt, max_tokens=32, temperature=0, stop="\n")
    assert cut.choices[0].text == stop.text and "\n" not in stop.text and cut.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_the_same_on_every_call(client: openai.OpenAI, ref: Engine) -> None:
    ask = dict(model=NAME, messages=CHATS[0], max_tokens=32, temperature=0.9, top_p=0.95, seed=11)
    texts = {client.chat.completions.create(**ask).choices[0].message.content for _ in range(3)}
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True))
    assert texts == {streamed} == {ref.chat(CHATS[0], max_new_tokens=32, temperature=0.9, top_p=0.95, seed=11).text}
    other = client.chat.completions.create(**{**ask, "seed": 12}).choices[0].message.content
    assert other != streamed  # the seed matters (a different seed gives another sample here)
    extra = {"top_k": 40, "min_p": 0.05}  # llama.cpp's knobs, as local servers accept them
    got = {client.chat.completions.create(**ask, extra_body=extra).choices[0].message.content for _ in range(2)}
    assert got == {ref.chat(CHATS[0], max_new_tokens=32, temperature=0.9, top_p=0.95, seed=11, **extra).text}


# ------------------------------------------------------------------------------ KV reuse across turns, turn dropping
def test_next_turn_prefills_only_the_new_suffix(served: LiveServer, client: openai.OpenAI, ref: Engine) -> None:
    turn1 = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    first = client.chat.completions.create(model=NAME, messages=turn1, max_tokens=16, temperature=0)
    held = served.engine.context  # what the engine's KV holds now: prompt 1 + reply 1
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "def sub(a, b):"}]
    second = client.chat.completions.create(model=NAME, messages=turn2, max_tokens=16, temperature=0)
    ids2 = ref.encode_chat(turn2)
    common = _lcp(ids2, held)
    assert common >= len(ref.encode_chat(turn1))  # the whole first prompt (and its reply) is still in the KV
    assert second.usage.prompt_tokens == len(ids2)
    assert second.usage.prompt_tokens_details.cached_tokens == common
    assert second.model_extra["edge_spec"]["prefilled_tokens"] == len(ids2) - common  # only the suffix


def test_prefilled_tokens_are_the_tokens_the_target_reads(demo_bundle: Path, ref: Engine) -> None:
    """Counted at the model: with speculation off and one new token, every row the target reads is prefill."""
    engine = Engine.load(demo_bundle, max_context=CONTEXT, drafting="none")
    rows: list[int] = []
    forward = engine.target.forward
    engine.target.forward = lambda tokens, *a, **k: (rows.append(len(tokens)), forward(tokens, *a, **k))[1]
    live = LiveServer(engine, ServeConfig(model_names=(NAME,)))
    try:
        client = live.client()
        turn1 = [{"role": "user", "content": "import numpy as np"}]
        client.chat.completions.create(model=NAME, messages=turn1, max_tokens=1, temperature=0)
        assert sum(rows) == len(ref.encode_chat(turn1))  # a fresh engine reads the whole prompt
        rows.clear()
        turn2 = turn1 + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "import pandas"}]
        got = client.chat.completions.create(model=NAME, messages=turn2, max_tokens=1, temperature=0)
        assert sum(rows) == got.model_extra["edge_spec"]["prefilled_tokens"] < len(ref.encode_chat(turn2)) - 5
    finally:
        live.stop()


def test_long_conversations_drop_old_turns_or_say_context_length_exceeded(served: LiveServer, client: openai.OpenAI,
                                                                          ref: Engine) -> None:
    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(12):
        msgs += [{"role": "user", "content": f"def function_number_{i}(x, y, z): return x + y * z - {i}"},
                 {"role": "assistant", "content": f"print(function_number_{i}(1, 2, 3))"}]
    msgs.append({"role": "user", "content": "def last():"})
    assert len(ref.encode_chat(msgs)) > CONTEXT
    kept, dropped = ref.fit_chat(msgs, 16)
    assert dropped and kept[0] == msgs[0]
    got = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=16, temperature=0)
    assert got.model_extra["edge_spec"]["dropped_messages"] == dropped
    assert got.choices[0].message.content == ref.chat(kept, max_new_tokens=16).text

    huge = [{"role": "user", "content": "x = 1 + 2 + 3 " * 200}]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=NAME, messages=huge, max_tokens=8)
    assert exc.value.status_code == 400 and exc.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:  # streaming: refused before the event stream starts
        client.chat.completions.create(model=NAME, messages=huge, max_tokens=8, stream=True)
    assert exc.value.status_code == 400 and exc.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=NAME, prompt="x = 1 + 2 + 3 " * 200, max_tokens=8)
    assert exc.value.code == "context_length_exceeded" and "shorten" in exc.value.message
    assert client.chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=4,
                                          temperature=0).choices[0].message.content


# ------------------------------------------------------------------------------ bad input: 4xx, never a traceback
OK = {"model": NAME, "messages": CHATS[0], "max_tokens": 4, "temperature": 0}  # greedy: a known, non-empty reply
DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD = [  # (what, path, body, status, code, param)
    ("invalid JSON", "/v1/chat/completions", b'{"messages": [', 400, "invalid_json", None),
    ("a JSON array", "/v1/chat/completions", b"[1, 2]", 400, "invalid_json", None),
    ("nested too deeply", "/v1/chat/completions", DEEP, 400, "invalid_json", None),
    ("empty body", "/v1/chat/completions", b"", 400, "invalid_json", None),
    ("not UTF-8", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "café"}]}'.encode("latin-1"),
     400, "invalid_encoding", None),
    ("missing messages", "/v1/chat/completions", {"model": NAME}, 400, "missing_required_parameter", "messages"),
    ("messages a string", "/v1/chat/completions", {"messages": "hi"}, 400, "invalid_type", "messages"),
    ("messages empty", "/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages"),
    ("message not an object", "/v1/chat/completions", {"messages": ["hi"]}, 400, "invalid_type", "messages[0]"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400,
     "invalid_value", "messages[0].role"),
    ("tool role", "/v1/chat/completions", {"messages": [{"role": "tool", "content": "hi"}]}, 400,
     "invalid_value", "messages[0].role"),
    ("missing role", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "invalid_value",
     "messages[0].role"),
    ("empty content", "/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, 400,
     "invalid_value", "messages[0].content"),
    ("content a number", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "invalid_type", "messages[0].content"),
    ("image content part", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "invalid_value",
     "messages[0].content[0]"),
    ("negative max_tokens", "/v1/chat/completions", {**OK, "max_tokens": -5}, 400, "invalid_value", "max_tokens"),
    ("zero max_tokens", "/v1/chat/completions", {**OK, "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("huge max_tokens", "/v1/chat/completions", {**OK, "max_tokens": 10**12}, 400, "invalid_value", "max_tokens"),
    ("huge max_completion_tokens", "/v1/chat/completions", {**OK, "max_tokens": None, "max_completion_tokens": 10**6},
     400, "invalid_value", "max_completion_tokens"),
    ("fractional max_tokens", "/v1/chat/completions", {**OK, "max_tokens": 1.5}, 400, "invalid_type", "max_tokens"),
    ("max_tokens a string", "/v1/chat/completions", {**OK, "max_tokens": "10"}, 400, "invalid_type", "max_tokens"),
    ("NaN temperature", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                                                b'"temperature": NaN}', 400, "invalid_value", "temperature"),
    ("infinite temperature", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                                                     b'"temperature": Infinity}', 400, "invalid_value", "temperature"),
    ("negative temperature", "/v1/chat/completions", {**OK, "temperature": -0.5}, 400, "invalid_value", "temperature"),
    ("temperature a string", "/v1/chat/completions", {**OK, "temperature": "hot"}, 400, "invalid_type", "temperature"),
    ("top_p 0", "/v1/chat/completions", {**OK, "top_p": 0}, 400, "invalid_value", "top_p"),
    ("top_p above 1", "/v1/chat/completions", {**OK, "top_p": 1.5}, 400, "invalid_value", "top_p"),
    ("min_p 1", "/v1/chat/completions", {**OK, "min_p": 1}, 400, "invalid_value", "min_p"),
    ("negative top_k", "/v1/chat/completions", {**OK, "top_k": -1}, 400, "invalid_value", "top_k"),
    ("negative seed", "/v1/chat/completions", {**OK, "seed": -1}, 400, "invalid_value", "seed"),
    ("stream a string", "/v1/chat/completions", {**OK, "stream": "yes"}, 400, "invalid_type", "stream"),
    ("stop a number", "/v1/chat/completions", {**OK, "stop": 5}, 400, "invalid_type", "stop"),
    ("n = 2", "/v1/chat/completions", {**OK, "n": 2}, 400, "unsupported_parameter", "n"),
    ("tools", "/v1/chat/completions", {**OK, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "unsupported_parameter", "tools"),
    ("top_logprobs 50", "/v1/chat/completions", {**OK, "logprobs": True, "top_logprobs": 50}, 400, "invalid_value",
     "top_logprobs"),
    ("unknown model", "/v1/chat/completions", {**OK, "model": "gpt-4o"}, 404, "model_not_found", "model"),
    ("model a number", "/v1/chat/completions", {**OK, "model": 3}, 400, "invalid_type", "model"),
    ("oversized body", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + b"x" * (2 << 20) +
     b'"}]}', 413, "request_too_large", None),
    ("completion without prompt", "/v1/completions", {"model": NAME}, 400, "missing_required_parameter", "prompt"),
    ("completion of token ids", "/v1/completions", {"prompt": [1, 2, 3]}, 400, "invalid_type", "prompt"),
    ("empty completion prompt", "/v1/completions", {"prompt": ""}, 400, "invalid_value", "prompt"),
    ("completion echo", "/v1/completions", {"prompt": "x", "echo": True}, 400, "unsupported_parameter", "echo"),
    ("unknown path", "/v1/embeddings", {"input": "x"}, 404, "not_found", None),
]


@pytest.mark.parametrize("what,path,body,status,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_openai_error_and_the_next_request_is_served(served: LiveServer, what: str, path: str,
                                                                       body: Any, status: int, code: str,
                                                                       param: str | None) -> None:
    r = _post(served, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert error["type"] == "invalid_request_error"
    assert error["message"].endswith(".") and "Traceback" not in r.text and len(error["message"]) < 300
    if code == "model_not_found":
        assert f"'{NAME}'" in error["message"]  # says which model is served
    if code == "request_too_large":
        assert str(1 << 20) in error["message"]  # says the limit
    nxt = _post(served, "/v1/chat/completions", OK)
    assert nxt.status_code == 200 and nxt.json()["choices"][0]["message"]["content"], nxt.text


def test_bad_input_through_the_openai_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=NAME, messages=CHATS[0], temperature=-1)  # (it refuses to send NaN)
    assert exc.value.param == "temperature" and exc.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=CHATS[0])
    assert "serves 'toy'" in exc.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], n=3)
    assert client.chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=4,
                                          temperature=0).choices[0].message.content


def test_oversized_body_without_content_length(served: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:  # chunked transfer: the limit is counted, not read from a header
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}]}'

    r = httpx.post(served.url + "/v1/chat/completions", content=chunks(), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert _post(served, "/v1/chat/completions", OK).status_code == 200


# ------------------------------------------------------------------------------ one at a time, queue, cancellation
class Gated:
    """The engine, except that generations wait for ``gate`` and yield their events ``delay`` seconds apart, so a test
    decides when a request runs; ``order`` records the order in which generations started."""

    def __init__(self, engine: Engine, delay: float = 0.0) -> None:
        self._engine, self.delay, self.order = engine, delay, []
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def chat(self, messages: list[dict[str, str]], config: Any, stream: bool) -> Iterator[Any]:
        self.order.append(messages[-1]["content"])
        assert self.gate.wait(30)
        return self._slow(self._engine.chat(messages, config, stream=True))

    def _slow(self, events: Iterator[Any]) -> Iterator[Any]:
        try:
            for event in events:
                time.sleep(self.delay)
                yield event
        finally:
            events.close()


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _ask(live: LiveServer, text: str, out: dict[str, Any], **kw: Any) -> threading.Thread:
    def run() -> None:
        try:
            out[text] = live.client().chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": text}], max_tokens=4, temperature=0, **kw)
        except Exception as exc:  # noqa: BLE001  (the test asserts on it)
            out[text] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_requests_run_one_at_a_time_in_order_and_a_full_queue_gets_503(demo_bundle: Path) -> None:
    gated = Gated(Engine.load(demo_bundle, max_context=CONTEXT))
    live = LiveServer(gated, ServeConfig(model_names=(NAME,), queue_size=1))
    try:
        gated.gate.clear()
        out: dict[str, Any] = {}
        first = _ask(live, "first", out)
        _until(lambda: live.health()["running"], "the first request runs")
        second = _ask(live, "second", out)
        _until(lambda: live.health()["waiting"] == 1, "the second request waits")
        with pytest.raises(openai.InternalServerError) as exc:
            live.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "third"}])
        assert exc.value.status_code == 503 and int(exc.value.response.headers["retry-after"]) >= 1
        assert exc.value.body["code"] == "server_busy" and exc.value.body["type"] == "server_error"
        gated.gate.set()
        first.join(30)
        second.join(30)
        assert gated.order == ["first", "second"]  # arrival order; the third never reached the engine
        assert all(isinstance(out[k], openai.types.chat.ChatCompletion) for k in ("first", "second")), out
        assert live.client().chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=4).choices
        assert live.idle()["rejected"] == 1
    finally:
        gated.gate.set()
        live.stop()


def test_client_that_leaves_cancels_its_generation_and_the_engine_stays_consistent(demo_bundle: Path,
                                                                                   ref: Engine) -> None:
    engine = Engine.load(demo_bundle, max_context=CONTEXT)
    gated = Gated(engine, delay=0.05)
    live = LiveServer(gated, ServeConfig(model_names=(NAME,)))
    messages = [{"role": "user", "content": "class Parser:"}]
    full = ref.chat(messages, max_new_tokens=120, temperature=0)
    assert len(full.token_ids) > 40  # long enough that leaving after a few chunks cuts it short
    try:
        client = live.client()
        stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=120, temperature=0,
                                                stream=True)
        chunks = iter(stream)
        next(chunks), next(chunks), next(chunks)
        stream.close()  # the client disconnects mid-stream
        health = live.idle()
        assert health["cancelled"] == 1 and health["served"] == 0
        st = engine.last_stats
        assert 0 < st.tokens < len(full.token_ids) // 2  # stopped at the next step, not run to the end
        assert len(engine.context) == st.prompt_tokens + st.tokens  # the committed tokens
        assert engine.target.length == len(engine.context) - 1  # KV rewound to them (the last is read next time)
        assert engine.context[st.prompt_tokens:] == list(full.token_ids[:st.tokens])

        # a non-streaming client that gives up while its generation runs, and one that gives up while it waits
        gated.delay = 0.2  # the greedy reply takes > 40 tokens, so > 2 s at several tokens a step
        with pytest.raises(openai.APITimeoutError):
            live.client(timeout=0.5).chat.completions.create(model=NAME, messages=messages, max_tokens=120,
                                                             temperature=0)
        _until(lambda: live.health()["cancelled"] == 2, "the running generation is cancelled")
        gated.gate.clear()
        out: dict[str, Any] = {}
        blocker = _ask(live, "first", out)
        _until(lambda: live.health()["running"], "a request runs")
        with pytest.raises(openai.APITimeoutError):
            live.client(timeout=0.5).chat.completions.create(model=NAME, messages=messages, max_tokens=4)
        _until(lambda: live.health()["waiting"] == 0, "the waiting request is dropped")
        gated.gate.set()
        blocker.join(30)
        assert live.idle()["cancelled"] == 3 and gated.order.count("class Parser:") == 2  # never started
        gated.delay = 0.0
        again = client.chat.completions.create(model=NAME, messages=messages, max_tokens=120, temperature=0)
        assert again.choices[0].message.content == full.text  # the engine is consistent after all that
    finally:
        gated.gate.set()
        live.stop()


def test_stopping_the_server_cancels_a_long_generation_at_its_next_step(demo_bundle: Path, ref: Engine) -> None:
    """What SIGINT/SIGTERM do (uvicorn's should_exit): no new requests; the reply in flight gets the grace period
    (2 s here), then it is cancelled at its next step and its stream still ends properly; the worker ends and the
    engine is left consistent."""
    messages = [{"role": "user", "content": "class Parser:"}]
    full = ref.chat(messages, max_new_tokens=120, temperature=0)
    engine = Engine.load(demo_bundle, max_context=CONTEXT)
    live = LiveServer(Gated(engine, delay=0.5), ServeConfig(model_names=(NAME,)))  # 2 s: a handful of steps
    stream = live.client().chat.completions.create(model=NAME, messages=messages, max_tokens=120, temperature=0,
                                                   stream=True)
    chunks = iter(stream)
    next(chunks)
    t0 = time.monotonic()
    stopper = threading.Thread(target=live.stop)
    stopper.start()
    rest = list(chunks)  # the client reads on while the server stops
    stopper.join(10)
    assert not live.thread.is_alive() and 1.5 < time.monotonic() - t0 < 8
    assert rest[-1].choices[0].finish_reason == "length" and rest[-1].model_extra["edge_spec"]["cancelled"] is True
    text = "".join(c.choices[0].delta.content or "" for c in rest)
    assert text and full.text.startswith(text) and len(text) < len(full.text)
    st = engine.last_stats
    assert 0 < st.tokens < len(full.token_ids) and len(engine.context) == st.prompt_tokens + st.tokens
    assert engine.target.length == len(engine.context) - 1


# ------------------------------------------------------------------------------ security defaults
def test_api_key(demo_bundle: Path) -> None:
    live = LiveServer(Engine.load(demo_bundle, max_context=CONTEXT), ServeConfig(model_names=(NAME,), api_key="s3cr3t"))
    try:
        missing = _post(live, "/v1/chat/completions", OK)
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        assert "missing" in missing.json()["error"]["message"]
        assert httpx.get(live.url + "/v1/models").status_code == 401
        for wrong in ("s3cr3", "s3cr3t!", "x" * 1000):
            with pytest.raises(openai.AuthenticationError) as exc:
                live.client(api_key=wrong).chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=4)
            assert exc.value.status_code == 401 and "incorrect" in exc.value.message
        assert live.client(api_key="s3cr3t").chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=4)
        assert httpx.get(live.url + "/health").status_code == 200  # health checks need no key
    finally:
        live.stop()


def test_no_cors_unless_asked(served: LiveServer, demo_bundle: Path) -> None:
    origin = {"Origin": "http://evil.example"}
    r = _post(served, "/v1/chat/completions", OK, headers=origin)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    preflight = {**origin, "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in httpx.options(served.url + "/v1/chat/completions",
                                                              headers=preflight).headers
    live = LiveServer(Engine.load(demo_bundle, max_context=CONTEXT),
                      ServeConfig(model_names=(NAME,), cors_origins=("http://localhost:3000",)))
    try:
        ok = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
        r = httpx.options(live.url + "/v1/chat/completions", headers=ok)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = _post(live, "/v1/chat/completions", OK, headers=origin)
        assert "access-control-allow-origin" not in r.headers
    finally:
        live.stop()


# ------------------------------------------------------------------------------ the command: start, warn, stop
class ServeProcess:
    """``python -m edge_spec serve ARGS`` in a subprocess; ``url`` from its start line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "edge_spec", "serve", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.reader.start()
        _until_slow(lambda: self.started() or self.proc.poll() is not None, "the server starts")
        assert self.started(), self.stderr()
        self.url = re.search(r"(http://\S+/v1) serves", self.stderr()).group(1)

    def started(self) -> bool:
        return " serves '" in self.stderr()

    def stderr(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        self.reader.join(5)
        return rc


def _until_slow(check: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_command_serves_and_exits_0_on_sigint_and_sigterm(demo_bundle: Path, ref: Engine, sig: int) -> None:
    server = ServeProcess([str(demo_bundle), "--port", "0", "--max-context", str(CONTEXT), "--model-name", NAME])
    try:
        assert server.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == [NAME]
        reply = client.chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=16, temperature=0)
        assert reply.choices[0].message.content == ref.chat(CHATS[0], max_new_tokens=16).text
        stream = client.chat.completions.create(model=NAME, messages=CHATS[1], max_tokens=CONTEXT // 2,
                                                temperature=0, stream=True)
        next(iter(stream))  # a stream is open when the signal comes (the toy may have generated it all by then;
        # test_stopping_the_server_cancels_a_long_generation_at_its_next_step covers a reply that is cut)
    finally:
        rc = server.stop(sig)
    err = server.stderr()
    assert rc == 0, err
    assert f"stopped ({signal.Signals(sig).name})" in err and "Traceback" not in err


def test_command_warns_when_reachable_from_the_network_without_a_key(demo_bundle: Path) -> None:
    open_server = ServeProcess([str(demo_bundle), "--host", "0.0.0.0", "--port", "0", "--max-context", "128"])
    assert open_server.stop() == 0
    assert "warning: listening on 0.0.0.0" in open_server.stderr() and "--api-key" in open_server.stderr()
    keyed = ServeProcess([str(demo_bundle), "--host", "0.0.0.0", "--port", "0", "--max-context", "128"],
                         env={"EDGE_SPEC_API_KEY": "k3y"})
    assert keyed.stop() == 0
    assert "warning" not in keyed.stderr()
    local = ServeProcess([str(demo_bundle), "--port", "0", "--max-context", "128"])  # the default: loopback
    assert local.stop() == 0
    assert "warning" not in local.stderr() and "http://127.0.0.1:" in local.stderr()


def test_command_errors_are_one_sentence(demo_bundle: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for args, said in (([str(demo_bundle), "--port", str(port)], f"Port {port} on 127.0.0.1 is in use"),
                           ([str(demo_bundle), "--host", "no-such-host.invalid"], "Cannot listen on host"),
                           ([str(demo_bundle), "--port", "70000"], "up to 65535"),
                           ([str(demo_bundle), "--api-key", " "], "The API key is empty")):
            proc = subprocess.run([sys.executable, "-m", "edge_spec", "serve", *args], capture_output=True,
                                  text=True, env=env, cwd=ROOT, timeout=120)
            assert proc.returncode == 2 and said in proc.stderr, proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    finally:
        taken.close()


LEAN = r"""
import sys
BLOCKED = ("starlette", "uvicorn", "fastapi", "httpx", "openai")

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
import edge_spec.runtime.engine
from edge_spec import Engine
from edge_spec.cli import build_parser, main
assert "serve" in build_parser().format_help()
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
sys.exit(main(["serve", "demo"]))
"""


def test_runtime_and_cli_work_without_the_serve_extra() -> None:
    proc = subprocess.run([sys.executable, "-c", LEAN], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("edge-spec: error: edge-spec serve needs the serve extra (starlette is missing); "
                                   "run pip install 'edge-spec[serve]'.")


def test_readme_serve_examples_work_verbatim_against_demo(demo_bundle: Path, tmp_path: Path) -> None:
    """The README's openai example and curl example, against `edge-spec serve` (its default bundle: demo, which the
    cache resolves to the toy pair here, as in test_demo_name). Only the port differs: the test's is a free one."""
    from edge_spec.demo import demo_checkpoints, demo_key

    home = tmp_path / "home"
    home.mkdir()
    (home / f"demo-{demo_key(demo_checkpoints())}").symlink_to(demo_bundle)
    server = ServeProcess(["--port", "0", "--max-context", str(CONTEXT)], env={"EDGE_SPEC_HOME": str(home)})
    port = server.url.split(":")[2].split("/")[0]
    try:
        readme = (ROOT / "README.md").read_text()
        section = readme[readme.index("## Serve"):]
        section = section[:section.index("\n## ", 1)]
        code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        assert len(code.strip().splitlines()) == 5 and 'model="demo"' in code and ":8080/v1" in code
        proc = subprocess.run([sys.executable, "-c", code.replace(":8080/", f":{port}/")], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "prompt_tokens" in proc.stdout and "acceptance_rate" in proc.stdout
        curl = re.search(r"```bash\n(curl .*?)```", section, re.S).group(1).replace(":8080/", f":{port}/")
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.rstrip().endswith("data: [DONE]"), out.stdout + out.stderr
        assert '"chat.completion.chunk"' in out.stdout
    finally:
        assert server.stop() == 0


def test_a_sampled_reply_may_fill_the_bundles_whole_context(demo_bundle: Path) -> None:
    """Found by serving (a request without max_tokens runs until the context is full): at the bundle's full
    context, a padded 1-token pass at the last position went past the graph's rotary table and ONNX Runtime
    failed. The graph's own extra row (export/invariance.py) sits one past the last position: its rotary table
    and the KV buffers hold one position more. Sampled steps draft less, so they reach it with one token."""
    engine = Engine.load(demo_bundle)
    cap = engine.plan.max_context
    t = engine.manifest.target
    assert cap == t.max_context and t.batch_invariant_rows == 1 and t.pad_rows == 1
    ids = engine.tokenizer.encode("x = 1\n" * cap).ids[:cap - 40]
    for seed in (0, 1, None, "greedy"):
        sampling = {"temperature": 0.0} if seed == "greedy" else {"temperature": 1.0, "seed": seed}
        with pytest.warns(RuntimeWarning, match="context is full"):
            r = engine.generate(ids, max_new_tokens=cap, config={"stop_token_ids": ()}, **sampling)
        assert r.finish_reason == "context_full" and len(engine.context) == cap + 1
