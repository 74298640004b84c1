"""Fill-in-the-middle (issue 46): the FIM tokens in the manifest, llama-server's infill prompt, ``Engine.infill``
(greedy speculative == plain), ``POST /infill`` and ``suffix`` on ``/v1/completions``, and the clear 400 for a model
without FIM tokens. Tiny random qwen2 GGUF pairs (tests/test_gguf_export.py's writer) whose vocabulary has
Qwen2.5-Coder's six FIM tokens, their ids named in the GGUF metadata as llama.cpp's converter writes them."""

from __future__ import annotations

import dataclasses
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from edge_spec.bundle import SCHEMA_VERSION, FimTokens, find_fim, manifest_from_json, read_manifest
from edge_spec.errors import BundleError, EdgeSpecError
from edge_spec.runtime import fim
from edge_spec.runtime import stops as fim_stops
from edge_spec.runtime.detok import StreamDetokenizer
from edge_spec.runtime.drafting import lookup_draft
from edge_spec.runtime.engine import Engine
from edge_spec.serve import ServeConfig
from tests.test_gguf_export import SPECIALS, write_tiny_gguf
from tests.test_serve import LiveServer, _post

FIM_TEXT = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
PRE, MID, SUF, PAD, REPO, SEP = range(3, 9)  # their ids: after SPECIALS' three
KV = {"tokenizer.ggml.fim_pre_token_id": PRE, "tokenizer.ggml.fim_suf_token_id": SUF,
      "tokenizer.ggml.fim_mid_token_id": MID}  # the other three are found by their text, as llama.cpp does
CONTEXT = 256
NAME = "tiny-coder"
CASES = [  # (prefix, suffix, extra files): the text around an editor's cursor
    ("def hello():\n    return ", "\n\nprint(hello())\n", []),
    ("def add(a, b):\n    ", "\n\ndef main():\n    print(add(1, 2))\n", [{"filename": "util.py", "text": "x = 1\n"}]),
    ("the capital of the world is ", " and the world is hello", [{"text": "hello world\nthe world\n"}]),
]


def _export(root: Path, name: str, specials: list[str], kv: dict[str, int]) -> Path:
    from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle

    target = write_tiny_gguf(root / f"{name}-t.gguf", "qwen2", 2, seed=1, specials=specials, kv=kv)
    drafter = write_tiny_gguf(root / f"{name}-d.gguf", "qwen2", 1, seed=2, specials=specials, kv=kv)
    prompts = root / "prompts.txt"
    prompts.write_text("def hello():\\n\nchat:hello world\n", encoding="utf-8")
    opts = ExportOptions(trim_vocab=120, calibration=prompts, max_context=CONTEXT, measure_memory=False,
                         target_quant=Quant("int4", 1), drafter_quant=Quant("int4", 4), kv_dtype="float32")
    export_bundle(str(target), str(drafter), root / name, opts, progress=None)
    return root / name


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """"fim": a pair with the six FIM tokens; "plain": the same without them; "gguf": the FIM target's GGUF."""
    root = tmp_path_factory.mktemp("fim")
    return {"fim": _export(root, "fim", SPECIALS + FIM_TEXT, KV), "plain": _export(root, "plain", SPECIALS, {}),
            "gguf": root / "fim-t.gguf"}


@pytest.fixture(scope="module")
def engine(bundles: dict[str, Path]) -> Engine:
    return Engine.load(bundles["fim"], max_context=CONTEXT)


@pytest.fixture(scope="module")
def served(bundles: dict[str, Path]) -> Iterator[LiveServer]:
    live = LiveServer(Engine.load(bundles["fim"], max_context=CONTEXT), ServeConfig(model_names=(NAME,)))
    yield live
    live.stop()


# ------------------------------------------------------------------------------ the tokens and the manifest
def test_fim_tokens_from_gguf_metadata_then_token_text() -> None:
    vocab = {t: i for i, t in enumerate(SPECIALS + FIM_TEXT)}
    assert find_fim(vocab) == FimTokens(PRE, SUF, MID, PAD, REPO, SEP, source="tokenizer")
    # the metadata's id wins over the text (llama.cpp reads the keys first); what it does not name is found by text
    got = find_fim(vocab, {"tokenizer.ggml.fim_pre_token_id": 1, "tokenizer.ggml.fim_sep_token_id": 2})
    assert got == FimTokens(1, SUF, MID, PAD, REPO, 2, source="gguf")
    # CodeLlama's sentencepiece names; no repo-level tokens
    assert find_fim({"▁<PRE>": 10, "▁<SUF>": 11, "▁<MID>": 12}) == FimTokens(10, 11, 12)
    assert find_fim({"<|fim_prefix|>": 1, "<|fim_suffix|>": 2}) is None  # no middle token: no FIM
    assert find_fim({t: i for i, t in enumerate(SPECIALS)}) is None


def test_export_records_fim_tokens_and_the_manifest_round_trips(bundles: dict[str, Path], tmp_path: Path) -> None:
    m = read_manifest(bundles["fim"])
    assert m.version == SCHEMA_VERSION
    assert m.tokenizer.fim == FimTokens(PRE, SUF, MID, PAD, REPO, SEP, source="gguf")
    assert read_manifest(bundles["plain"]).tokenizer.fim is None
    data = json.loads((bundles["fim"] / "edge_spec.json").read_text())
    assert manifest_from_json(json.loads(json.dumps(m.to_json()))) == m  # written and read back: the same manifest
    bad = json.loads(json.dumps(data))
    bad["tokenizer"]["fim"]["middle"] = 10**6
    with pytest.raises(BundleError, match="tokenizer.fim.middle"):
        manifest_from_json(bad)
    # a bundle written before the field (version 9): the runtime finds the tokens in its tokenizer
    old = tmp_path / "old"
    shutil.copytree(bundles["fim"], old)
    del data["tokenizer"]["fim"]
    data["version"] = 9
    (old / "edge_spec.json").write_text(json.dumps(data))
    assert read_manifest(old).tokenizer.fim is None
    assert Engine.load(old, max_context=CONTEXT).fim == FimTokens(PRE, SUF, MID, PAD, REPO, SEP, source="tokenizer")
    # ... while a version-10 manifest without FIM tokens means the model has none
    assert Engine.load(bundles["plain"], max_context=CONTEXT).fim is None


# ------------------------------------------------------------------------------ the prompt
def test_prompt_layout_is_llama_servers(engine: Engine) -> None:
    tok = engine.tokenizer
    as_text = Tokenizer.from_str(tok.to_str())
    as_text.encode_special_tokens = True  # llama.cpp's parse_special=false: "<|fim_pad|>" is just text

    def plain(text: str) -> list[int]:
        return as_text.encode(text, add_special_tokens=False).ids

    assert len(plain("<|fim_middle|>")) > 1

    f = engine.fim
    extra = [fim.ExtraFile("x", "a.py"), fim.ExtraFile("y")]
    got = fim.infill_ids(tok, f, "p<|fim_middle|>", "s", extra, prompt="<|fim_pad|>q")
    want = [REPO, *plain("myproject\n"), SEP, *plain("a.py\n"), *plain("x"), SEP, *plain("tmp\n"), *plain("y"),
            SEP, *plain("filename\n"), PRE, *plain("p"), *plain("<|fim_middle|>"), PAD, *plain("q"), SUF, *plain("s"),
            MID]
    assert got == want  # special-token text in the file reads as text; in ``prompt`` it is parsed
    assert MID not in got[:-1]
    # budgets: the last 3/4 batch of the prefix, the first batch/4 - 2 - len(prompt) of the suffix, and of the extra
    # tokens the last n_ctx - n_batch - 2 n_predict
    pre, suf, ext = "hello " * 20, "world " * 20, [fim.ExtraFile("the " * 30)]
    cut = fim.infill_ids(tok, f, pre, suf, ext, prompt="and", batch=16, predict=4, context=40)
    p_ids, s_ids = plain(pre), plain(suf)
    e_ids = [REPO, *plain("myproject\n"), SEP, *plain("tmp\n"), *plain("the " * 30), SEP, *plain("filename\n")]
    assert cut == [*e_ids[-16:], PRE, *p_ids[-12:], *plain("and"), SUF, *s_ids[:1], MID]
    # a model without the repo-level tokens: each extra file after llama-server's snippet line
    bare = dataclasses.replace(f, repo_name=None, file_sep=None)
    assert fim.infill_ids(tok, bare, "p", "s", [fim.ExtraFile("x")]) == \
        [*plain("\n\n--- snippet ---\n\n"), *plain("x"), PRE, *plain("p"), SUF, *plain("s"), MID]


def test_prompt_equals_llama_servers_own(bundles: dict[str, Path], engine: Engine) -> None:
    """The same GGUF in llama-server: its /infill prompt (text and token count) equals ours, budgets included."""
    from benchmarks.lib.llamacpp import LlamaServer, bin_dir

    if bin_dir() is None:
        pytest.skip("llama.cpp is not built (benchmarks/build_llamacpp.sh); the layout test above still holds")
    pre, suf = "def hello():\n    return <|fim_prefix|> the" * 3, "\n\nprint(hello())\n" * 5
    extra = [{"filename": "a.py", "text": "the world\n" * 30}, {"text": "hello"}]
    with LlamaServer(bundles["gguf"], threads=1, context=CONTEXT, extra=["-b", "64", "-ub", "64"]) as server:
        for prompt in ("", "wor"):
            body = json.dumps({"input_prefix": pre, "input_suffix": suf, "input_extra": extra, "prompt": prompt,
                               "n_predict": 1}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{server.port}/infill", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                theirs = json.loads(r.read())
            ours = fim.infill_ids(engine.tokenizer, engine.fim, pre, suf, fim.extra_files(extra), prompt, batch=64,
                                  predict=-1, context=CONTEXT)
            assert theirs["tokens_evaluated"] == len(ours)
            assert theirs["prompt"] == engine.tokenizer.decode(ours, skip_special_tokens=False)


# ------------------------------------------------------------------------------ Engine.infill
def test_infill_greedy_speculative_equals_plain(bundles: dict[str, Path], engine: Engine) -> None:
    plain = Engine.load(bundles["fim"], drafting="none", max_context=CONTEXT)
    drafted = 0
    for prefix, suffix, extra in CASES:
        want = plain.infill(prefix, suffix, extra, max_new_tokens=24, temperature=0)
        got = engine.infill(prefix, suffix, extra, max_new_tokens=24, temperature=0, draft_length=3)
        assert got.token_ids == want.token_ids and got.text == want.text
        drafted += got.stats.drafted
        ids = fim.engine_ids(engine.tokenizer, engine.fim, prefix, suffix, extra, "", CONTEXT, 24)
        # the engine's context is the whole FIM prompt (prefix, suffix, extra files) + the middle: lookup reads it all
        assert engine.context == ids + list(got.token_ids)
        streamed = list(engine.infill(prefix, suffix, extra, max_new_tokens=24, temperature=0, stream=True))
        assert "".join(e.text for e in streamed) == want.text
    assert drafted > 0


def test_lookup_drafts_from_the_suffix_and_extra_files(engine: Engine) -> None:
    """A prefix ending in words that the suffix (or another file) continues: prompt lookup drafts the continuation."""
    for suffix, extra in (("\nprint the world is hello and", []), ("", [{"text": "print the world is hello and"}])):
        ids = fim.infill_ids(engine.tokenizer, engine.fim, "def f():\n    print the", suffix, fim.extra_files(extra))
        ctx = np.asarray(ids + engine.tokenizer.encode(" world", add_special_tokens=False).ids, dtype=np.int64)
        got = engine.tokenizer.decode(lookup_draft(ctx, len(ctx), 8).tolist())
        assert got.startswith(" is hello and"), got


def test_infill_stops_on_fim_tokens_and_refuses_without_them(bundles: dict[str, Path], engine: Engine) -> None:
    assert set(fim.stop_ids(engine.fim, engine.manifest.tokenizer)) >= {PAD, REPO, SEP}
    plain = Engine.load(bundles["plain"], max_context=CONTEXT)
    with pytest.raises(EdgeSpecError, match="no fill-in-the-middle tokens .* so infill\\(\\) cannot be used"):
        plain.infill("def f():", "\n")
    with pytest.raises(EdgeSpecError, match="extra\\[0\\]"):
        engine.infill("a", "b", [{"name": "x"}])
    assert len(plain.generate("def hello", max_new_tokens=4, temperature=0).token_ids) >= 1  # the engine still works


# ------------------------------------------------------------------------------ the server
def _events(live: LiveServer, path: str, body: dict[str, Any]) -> list[Any]:
    out = []
    with httpx.stream("POST", live.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@pytest.mark.parametrize("case", CASES)
def test_infill_endpoint_greedy_equals_engine_infill(served: LiveServer, engine: Engine, case: tuple) -> None:
    prefix, suffix, extra = case
    want = engine.infill(prefix, suffix, extra, max_new_tokens=16, temperature=0, n_indent=4)
    body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra, "n_predict": 16,
            "temperature": 0, "cache_prompt": True, "samplers": ["top_k", "top_p", "infill"], "n_indent": 4}
    r = _post(served, "/infill", body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["content"] == want.text and got["stop"] is True
    assert got["tokens_predicted"] == len(want.token_ids) and got["tokens_evaluated"] == want.stats.prompt_tokens
    assert got["stop_type"] == {"stop_token": "eos", "length": "limit", "indent": "limit"}[want.finish_reason]
    assert got["prompt"].startswith("<|repo_name|>myproject\n") and got["prompt"].endswith("<|fim_middle|>")
    assert got["timings"]["predicted_n"] == len(want.token_ids) and got["timings"]["prompt_ms"] > 0
    events = _events(served, "/infill", {**body, "stream": True})
    assert "[DONE]" not in events  # llama-server's own stream ends with the "stop": true event
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == want.text
    assert events[-1]["tokens_predicted"] == len(want.token_ids)


def test_infill_endpoint_uses_llama_servers_sampling_defaults(served: LiveServer, engine: Engine) -> None:
    prefix, suffix, extra = CASES[0]
    want = engine.infill(prefix, suffix, extra, max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.95,
                         min_p=0.05, seed=7)
    got = _post(served, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 12, "seed": 7})
    assert got.json()["content"] == want.text
    assert got.json()["generation_settings"]["temperature"] == 0.8


def test_completions_suffix_plain_and_streamed(served: LiveServer, engine: Engine) -> None:
    client = served.client()
    for prefix, suffix, _ in CASES:
        want = engine.infill(prefix, suffix, max_new_tokens=16, temperature=0)
        got = client.completions.create(model=NAME, prompt=prefix, suffix=suffix, max_tokens=16, temperature=0)
        assert got.choices[0].text == want.text
        assert got.usage.prompt_tokens == want.stats.prompt_tokens
        stream = client.completions.create(model=NAME, prompt=prefix, suffix=suffix, max_tokens=16, temperature=0,
                                           stream=True)
        assert "".join(c.choices[0].text for c in stream) == want.text
    plain = client.completions.create(model=NAME, prompt=CASES[0][0], suffix="", max_tokens=8, temperature=0)
    assert plain.choices[0].text == engine.generate(CASES[0][0], max_new_tokens=8, temperature=0).text


def test_bad_infill_requests_get_one_clear_400(served: LiveServer) -> None:
    bad = [({"input_suffix": "x"}, "input_prefix", "is required"),
           ({"input_prefix": 3, "input_suffix": ""}, "input_prefix", "must be a string"),
           ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}, "input_extra", "an array"),
           ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, "input_extra[0]", "text"),
           ({"input_prefix": "", "input_suffix": "", "n_predict": 0}, "n_predict", "n_predict must be"),
           ({"input_prefix": "", "input_suffix": "", "n_probs": 5}, "n_probs", "not supported"),
           ({"input_prefix": "", "input_suffix": "", "temperature": "hot"}, "temperature", "must be")]
    for body, param, says in bad:
        r = _post(served, "/infill", body)
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert err["param"] == param and says in err["message"], err
    r = _post(served, "/infill", {"input_prefix": "def f():", "input_suffix": "", "n_predict": 2})
    assert r.status_code == 200 and r.json()["tokens_predicted"] <= 2


def test_model_without_fim_tokens_gets_a_400_and_then_serves(bundles: dict[str, Path]) -> None:
    live = LiveServer(Engine.load(bundles["plain"], max_context=CONTEXT), ServeConfig(model_names=(NAME,)))
    try:
        for path, body, param in (("/infill", {"input_prefix": "a", "input_suffix": "b"}, "input_prefix"),
                                  ("/v1/completions", {"prompt": "a", "suffix": "b", "max_tokens": 4}, "suffix")):
            r = _post(live, path, body)
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["code"] == "fim_not_supported" and err["param"] == param
            assert "has no fill-in-the-middle tokens" in err["message"]
        ok = _post(live, "/v1/completions", {"prompt": "def hello", "max_tokens": 4, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is not None
    finally:
        live.stop()


# ------------------------------------------------------------------------------ n_indent, t_max_predict_ms
class Writer:
    """A model at the backend seam (runtime/speculative.py ``Model``) that writes ``script`` after the first ``start``
    positions whatever it is fed, then ``stop``; at the script indices in ``wrong`` it writes ``other`` instead (a
    drafter that is sometimes wrong)."""

    def __init__(self, vocab_size: int, script: list[int], stop: int, wrong: frozenset[int] = frozenset(),
                 other: int = 0) -> None:
        self.vocab_size, self.capacity, self.max_rows, self.length, self.run_seconds = vocab_size, CONTEXT, 16, 0, 0.0
        self.script, self.stop, self.wrong, self.other, self.start = script, stop, wrong, other, 0

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        out = np.zeros((len(tokens), self.vocab_size), dtype=np.float32)
        for i in range(len(tokens)):
            k = self.length + i + 1 - self.start  # the script index of the token after this position
            out[i, self.other if k in self.wrong else self.script[k] if 0 <= k < len(self.script) else self.stop] = 9
        self.length += len(tokens)
        return out

    def rewind_to(self, n: int) -> None:
        self.length = n


PREFIX, SUFFIX = "def f(x):\n    if x:\n        ", "\n    return 0\n"
SCRIPT = "y = 1\n        z = 2\n    return y\nprint(f(1))\n"  # the cursor's line is indented by 8


def _writer_engine(engine: Engine, text: str, wrong: frozenset[int] = frozenset()) -> Engine:
    """``engine``'s bundle with a target that writes ``text`` and a drafter that drafts it (wrong at ``wrong``)."""
    ids = engine.tokenizer.encode(text, add_special_tokens=False).ids
    vocab, stop = engine.manifest.target.vocab_size, engine.manifest.tokenizer.stop_token_ids[0]
    plan = dataclasses.replace(engine.plan, mode="speculative", draft_length=4)
    config = dataclasses.replace(engine.config, drafting="model")
    return Engine(engine.manifest, engine.tokenizer, plan, Writer(vocab, ids, stop),
                  Writer(vocab, ids, stop, wrong, other=ids[0]), None, config, {"target": "cpu", "drafter": "cpu"})


def _start(writer: Engine, prefix: str, suffix: str, max_new_tokens: int) -> None:
    start = len(fim.engine_ids(writer.tokenizer, writer.fim, prefix, suffix, (), "", CONTEXT, max_new_tokens))
    writer.target.start = writer.drafter.start = start


def _stops(engine: Engine, n_indent: int = 0, stop: tuple[str, ...] = (), **kw: Any) -> fim_stops.TextStops:
    return fim_stops.TextStops(StreamDetokenizer(engine.tokenizer), stop, n_indent, **kw)


def test_indentation_cut_is_llama_servers(engine: Engine) -> None:
    """The cut line, the text kept (its line break and indentation), the tokens read before the stop (llama-server
    looks at a line from the token after its line break, two after for the first one), whatever the step sizes."""
    tok = engine.tokenizer

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def after(kept: str, n: int) -> int:
        return len(ids(kept)) + n

    cases = [  # (text, n_indent, stop strings, the text kept, why, tokens read)
        (SCRIPT, 8, (), "y = 1\n        z = 2\n    ", "indent", after("y = 1\n        z = 2\n    ", 1)),
        (SCRIPT, 4, (), "y = 1\n        z = 2\n    return y\n", "indent",
         after("y = 1\n        z = 2\n    return y\n", 1)),
        ("y = 1\nprint(y)\nx\n", 8, (), "y = 1\n", "indent", after("y = 1\n", 2)),  # the first break: one late
        ("a = 1\n    b = 2\n\n    c = 3\n", 4, (), "a = 1\n    b = 2\n", "indent",  # an empty line ends it
         after("a = 1\n    b = 2\n", 1)),
        ("x\n\ty\n\t\tz\n", 1, (), "x\n\ty\n\t\tz\n", None, after("x\n\ty\n\t\tz\n", 0)),  # tabs indent
        (SCRIPT, 0, (), SCRIPT, None, after(SCRIPT, 0)),
        (SCRIPT, 8, ("z =",), "y = 1\n        ", "stop_string", after("y = 1\n        z =", 0)),
    ]
    for text, n_indent, stop, kept, why, n_read in cases:
        script = ids(text)
        for size in (1, 2, 3, 5, len(script)):  # plain decoding, and speculative steps of other sizes
            ends, read, got, pieces = _stops(engine, n_indent, stop), 0, None, []
            for i in range(0, len(script), size):
                used, got = ends.feed(script[i:i + size])
                read += used
                pieces.append(ends.take(final=got is not None))
                assert kept.startswith("".join(pieces)), (text, size)  # nothing streamed that a cut takes back
                if got:
                    break
            pieces.append(ends.take(final=True))
            assert (ends.text, got, read, "".join(pieces)) == (kept, why, n_read, kept), (text, n_indent, size)


def test_time_limit_ends_at_the_next_line_break(engine: Engine) -> None:
    tok = engine.tokenizer
    script = tok.encode("a = 1\nb = 2\nc = 3\n", add_special_tokens=False).ids
    first_break = [tok.decode([t]) for t in script].index("\n")
    for limit, want in ((0, None), (100, "a = 1\nb = 2\n")):
        # the first token at 0 s, up to the first line break 50 ms later, then 200 ms
        clock = iter([0.0] + [0.05] * first_break + [0.2] * len(script))
        ends = _stops(engine, t_max_predict_ms=limit, clock=lambda: next(clock))  # noqa: B023
        for t in script:
            used, why = ends.feed([t])
            if why:
                break
        assert (ends.text, why) == ((want, "time_limit") if want else (tok.decode(script), None))


def test_indentation_cut_equals_llama_servers_own(bundles: dict[str, Path], engine: Engine) -> None:
    """The FIM GGUF in llama-server, sampling (seeded) among line breaks, spaces, tabs and "x" only: its answer with
    n_indent = k is what our cut makes of its answer without — the text, and the tokens it read before stopping."""
    from benchmarks.lib.llamacpp import LlamaServer, bin_dir

    if bin_dir() is None:
        pytest.skip("llama.cpp is not built (benchmarks/build_llamacpp.sh); the cases above still hold")
    tok = engine.tokenizer
    allowed = {tok.token_to_id(t) for t in ("Ċ", "Ġ", "ĉ", "x", "the")}
    bias = [[i, False] for i in range(engine.manifest.target.vocab_size) if i not in allowed]
    cuts = 0
    with LlamaServer(bundles["gguf"], threads=1, context=CONTEXT) as server:
        def ask(seed: int, n_indent: int) -> dict[str, Any]:
            body = {"input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 64, "seed": seed,
                    "temperature": 40.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": bias,
                    "return_tokens": True, "n_indent": n_indent, "cache_prompt": False}
            req = urllib.request.Request(f"http://127.0.0.1:{server.port}/infill", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())

        for seed in range(1, 7):
            whole = ask(seed, 0)
            for n_indent in (1, 2, 3):
                theirs = ask(seed, n_indent)
                assert whole["tokens"][:len(theirs["tokens"])] == theirs["tokens"]  # the same draws, then the stop
                for size in (1, 4):
                    ends, read, why = _stops(engine, n_indent), 0, None
                    for i in range(0, len(whole["tokens"]), size):
                        used, why = ends.feed(whole["tokens"][i:i + size])
                        read += used
                        if why:
                            break
                    assert ends.text == theirs["content"], (seed, n_indent, size)
                    assert read == theirs["tokens_predicted"] and theirs["stop_type"] == "limit"
                    cuts += why == "indent"
    assert cuts >= 20  # most of the 36 answers were cut


def test_infill_cut_speculative_equals_plain(engine: Engine) -> None:
    """A target that writes SCRIPT: n_indent cuts it at the line with less indentation, in plain and speculative
    decoding alike (a stop inside a step drops the step's later tokens from the context too), streamed or not."""
    for wrong in (frozenset(), frozenset({3, 9, 10, 22})):
        writer = _writer_engine(engine, SCRIPT, wrong)
        script = list(writer.target.script)
        results = {}
        for name, opts in (("plain", {"speculative": False}), ("spec", {"draft_length": 4})):
            _start(writer, PREFIX, SUFFIX, 40)
            r = writer.infill(PREFIX, SUFFIX, max_new_tokens=40, temperature=0, n_indent=8, **opts)
            results[name] = (r.text, r.token_ids, r.finish_reason, writer.context, r.stats.tokens)
            streamed = list(writer.infill(PREFIX, SUFFIX, max_new_tokens=40, temperature=0, n_indent=8, stream=True,
                                          **opts))
            assert "".join(e.text for e in streamed) == r.text
            assert all("    return" not in e.text for e in streamed)
            if name == "spec":
                assert r.stats.accepted > 0 and any(len(e.token_ids) > 1 for e in streamed)
        assert results["spec"] == results["plain"]
        text, ids, finish, context, n = results["plain"]
        assert (text, finish) == ("y = 1\n        z = 2\n    ", "indent")
        assert list(ids) == script[:len(ids)] and context[-len(ids):] == list(ids) and n == len(ids)
        assert writer.infill(PREFIX, SUFFIX, max_new_tokens=40, temperature=0).text == SCRIPT  # no n_indent: all


def test_infill_endpoint_cuts_at_n_indent(engine: Engine) -> None:
    writer = _writer_engine(engine, SCRIPT, frozenset({5}))
    live = LiveServer(writer, ServeConfig(model_names=(NAME,)))
    try:
        _start(writer, PREFIX, SUFFIX, 40)
        want = writer.infill(PREFIX, SUFFIX, max_new_tokens=40, temperature=0, n_indent=8)
        body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 40, "temperature": 0, "n_indent": 8,
                "t_max_prompt_ms": 500, "t_max_predict_ms": 60_000}
        got = _post(live, "/infill", body).json()
        assert got["content"] == want.text == "y = 1\n        z = 2\n    "
        assert got["stop_type"] == "limit" and got["tokens_predicted"] == len(want.token_ids)
        events = _events(live, "/infill", {**body, "stream": True})
        assert "".join(e["content"] for e in events) == want.text and events[-1]["stop_type"] == "limit"
        assert _post(live, "/infill", {**body, "n_indent": 0}).json()["content"] == SCRIPT
        for name, value in (("n_indent", -1), ("n_indent", "4"), ("n_indent", 1.5), ("t_max_predict_ms", -2),
                            ("t_max_predict_ms", True)):
            r = _post(live, "/infill", {**body, name: value})
            assert r.status_code == 400 and r.json()["error"]["param"] == name, (name, value)
            assert f"{name} must be a whole number" in r.json()["error"]["message"]
        assert _post(live, "/infill", {**body, "t_max_predict_ms": -1}).json()["content"] == want.text
    finally:
        live.stop()
