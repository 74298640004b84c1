"""``logprobs`` / ``top_logprobs`` on the server (issue 46), with the official ``openai`` client and raw httpx against
a live uvicorn server on the toy pair: OpenAI's shapes, the engine's values, streamed == whole, bad input -> 400."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge_spec.runtime.engine import Engine
from edge_spec.serve import ServeConfig
from tests.test_serve import CHATS, CONTEXT, NAME, LiveServer

OK = {"model": NAME, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def served(demo_bundle: Path) -> Iterator[LiveServer]:
    live = LiveServer(Engine.load(demo_bundle, max_context=CONTEXT), ServeConfig(model_names=(NAME,)))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def ref(demo_bundle: Path) -> Engine:
    return Engine.load(demo_bundle, max_context=CONTEXT)


@pytest.fixture()
def client(served: LiveServer) -> openai.OpenAI:
    return served.client()


def _post(live: LiveServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(live.url + path, content=json.dumps(body).encode(), timeout=30)


def _sse(live: LiveServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(live.url + path, json={**body, "stream": True}, timeout=30)
    assert r.status_code == 200, r.text
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_logprobs_are_the_engines_and_greedy_top_1_is_the_text(client: openai.OpenAI, ref: Engine,
                                                                     messages: list[dict[str, str]]) -> None:
    got = client.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0, logprobs=True,
                                         top_logprobs=5)
    want = ref.chat(messages, max_new_tokens=24, temperature=0, logprobs=5)
    choice = got.choices[0]
    assert choice.message.content == want.text
    content = choice.logprobs.content
    assert b"".join(bytes(c.bytes) for c in content).decode() == want.text  # the tokens spell the text
    assert all(c.top_logprobs[0].token == c.token and c.top_logprobs[0].logprob == c.logprob for c in content)
    assert all(len(c.top_logprobs) == 5 for c in content)
    reported = want.logprobs[:len(content)]  # the engine's values; an end-of-turn token after the text is not listed
    assert [c.logprob for c in content] == [lp.logprob for lp in reported]
    assert [[t.logprob for t in c.top_logprobs] for c in content] == [[v for _, v in lp.top] for lp in reported]
    assert len(content) in (len(want.token_ids), len(want.token_ids) - 1)
    if len(content) < len(want.token_ids):
        assert want.finish_reason == "stop_token" and ref.token_bytes(want.token_ids[-1]) == b""


def test_streamed_chat_logprobs_equal_the_whole_ones(served: LiveServer) -> None:
    body = {**OK, "messages": CHATS[1], "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = _post(served, "/v1/chat/completions", body).json()["choices"][0]
    chunks = _sse(served, "/v1/chat/completions", body)
    streamed = [c for ch in chunks for choice in ch["choices"] if choice["logprobs"]
                for c in choice["logprobs"]["content"]]
    assert streamed == whole["logprobs"]["content"] and streamed
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"]) == \
        whole["message"]["content"]


def test_logprobs_without_top_logprobs_list_no_alternatives(served: LiveServer) -> None:
    r = _post(served, "/v1/chat/completions", {**OK, "temperature": 0, "logprobs": True})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert r.status_code == 200 and content and all(c["top_logprobs"] == [] for c in content)
    off = _post(served, "/v1/chat/completions", {**OK, "logprobs": False, "top_logprobs": 0}).json()
    assert off["choices"][0]["logprobs"] is None


def test_sampled_logprobs_are_the_filtered_distribution(client: openai.OpenAI, ref: Engine) -> None:
    kw = {"max_tokens": 16, "temperature": 0.9, "seed": 3, "top_p": 0.9}
    got = client.chat.completions.create(model=NAME, messages=CHATS[0], logprobs=True, top_logprobs=20, **kw)
    want = ref.chat(CHATS[0], max_new_tokens=16, temperature=0.9, seed=3, top_p=0.9, logprobs=20)
    content = got.choices[0].logprobs.content
    assert [c.logprob for c in content] == [lp.logprob for lp in want.logprobs[:len(content)]]
    short = 0
    for c in content:  # the token was drawn from the distribution whose values are reported
        listed = [t.logprob for t in c.top_logprobs]
        if len(listed) < 20:  # top-p kept fewer than 20 tokens: all are listed, and they sum to 1
            short += 1
            assert c.logprob in listed and sum(math.exp(v) for v in listed) == pytest.approx(1.0, abs=1e-6)
        else:
            assert c.logprob in listed or c.logprob <= listed[-1]
    assert short > 0  # the filter did cut somewhere (else this test would not look at it)


def test_completions_logprobs_in_the_legacy_shape(served: LiveServer, client: openai.OpenAI, ref: Engine) -> None:
    prompt = "def fibonacci(n):"
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0, logprobs=3)
    want = ref.generate(prompt, max_new_tokens=24, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert got.choices[0].text == want.text
    assert lp.token_logprobs == [x.logprob for x in want.logprobs][:len(lp.tokens)]
    assert [list(d.values()) for d in lp.top_logprobs] == [[v for _, v in x.top] for x in want.logprobs][
        :len(lp.tokens)]
    assert all(next(iter(d)) == t for d, t in zip(lp.top_logprobs, lp.tokens))  # greedy: the first is the token
    assert lp.text_offset[0] == len(prompt)  # offsets count from the start of the prompt, as OpenAI's do
    text = got.choices[0].text
    for i, (tok, off) in enumerate(zip(lp.tokens, lp.text_offset)):
        assert text[off - len(prompt):].startswith(tok) or "\\x" in tok, (i, tok)
    body = {"model": NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 3}
    whole = _post(served, "/v1/completions", body).json()["choices"][0]["logprobs"]
    chunks = _sse(served, "/v1/completions", body)
    merged: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for ch in chunks:
        for choice in ch["choices"]:
            for k in merged:
                merged[k] += (choice["logprobs"] or {}).get(k, [])
    assert merged == whole


def test_tokens_past_a_stop_string_are_not_reported(client: openai.OpenAI, ref: Engine) -> None:
    prompt = "def fibonacci(n):"
    full = ref.generate(prompt, max_new_tokens=32, temperature=0, logprobs=1)
    stop = '"""'
    assert 0 < full.text.find(stop) < len(full.text) - 10  # the toy model writes a docstring: cut there
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=32, temperature=0, stop=stop, logprobs=1)
    choice = got.choices[0]
    assert choice.text == full.text[:full.text.find(stop)]
    offsets = [o - len(prompt) for o in choice.logprobs.text_offset]
    assert offsets and all(o < len(choice.text) for o in offsets)  # every reported token starts in the text
    n = len(offsets)
    assert choice.logprobs.token_logprobs == [x.logprob for x in full.logprobs[:n]]
    assert len(b"".join(ref.token_bytes(t) for t in full.token_ids[:n]).decode()) >= len(choice.text)
    assert "".join(choice.logprobs.tokens).startswith(choice.text)  # the last token may hold the stop string


BAD = [
    ("top_logprobs 50", "/v1/chat/completions", {**OK, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ("top_logprobs -1", "/v1/chat/completions", {**OK, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("top_logprobs a string", "/v1/chat/completions", {**OK, "logprobs": True, "top_logprobs": "5"}, "top_logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {**OK, "top_logprobs": 3}, "top_logprobs"),
    ("logprobs a number on chat", "/v1/chat/completions", {**OK, "logprobs": 5}, "logprobs"),
    ("completions logprobs 21", "/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("completions logprobs true", "/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
]


@pytest.mark.parametrize("what,path,body,param", BAD, ids=[b[0] for b in BAD])
def test_bad_logprobs_get_one_400_and_the_next_request_is_served(served: LiveServer, what: str, path: str,
                                                                 body: dict[str, Any], param: str) -> None:
    r = _post(served, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].endswith(".") and "Traceback" not in r.text and len(error["message"]) < 300
    nxt = _post(served, "/v1/chat/completions", {**OK, "logprobs": True, "top_logprobs": 20})
    assert nxt.status_code == 200 and len(nxt.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
