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
import uvicorn

from edge_spec.runtime.engine import Engine
from edge_spec.serve import ServeConfig, create_app
from edge_spec.serve.run import bind

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
    """``create_app(engine, config)`` run by uvicorn in a thread on a free loopback port."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        self.engine = engine
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(engine, config), log_level="warning", lifespan="on",
                                                    timeout_graceful_shutdown=2))
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
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=NAME, prompt="x = 1 + 2 + 3 " * 200, max_tokens=8)
    assert exc.value.code == "context_length_exceeded" and "shorten" in exc.value.message
    assert client.chat.completions.create(model=NAME, messages=CHATS[0], max_tokens=4).choices[0].message.content
