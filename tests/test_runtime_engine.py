"""End-to-end runtime tests on the demo bundle: losslessness, rewind, fallback, interruption, chat, streaming."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from test_runtime_support import plain_logits, runtime_bundle

from edge_spec import Engine
from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.sampling import Noise, SamplingConfig, probs, verify

pytestmark = pytest.mark.slow

PROMPTS = [f"{a} {b}" for a in ("Once upon a time", "The answer is", "def main():", "In 1999, the", "Dear friend,",
                                "Q: What is the capital of France?\nA:", "import numpy as np\n", "The cat sat on",
                                "Step 1:", "Hello, my name is")
           for b in ("", "there was", "we", "it", "and")]


@pytest.fixture(scope="module")
def bundle(request) -> Path:
    return runtime_bundle(request)


@pytest.fixture(scope="module")
def engine(bundle) -> Engine:
    return Engine.load(bundle)


def _discrepancy(engine: Engine, bundle: Path) -> float:
    """Max |logit| difference between one 5-token verify pass and 5 single-token steps (same graph)."""
    t = engine.target
    worst = 0.0
    for seed in range(4):
        toks = np.random.default_rng(seed).integers(5, engine.manifest.target.vocab_size, size=19)
        t.rewind_to(0)
        t.forward(toks[:14])
        multi = t.forward(toks[14:19]).copy()
        t.rewind_to(14)
        single = np.stack([t.forward(toks[i:i + 1])[0].copy() for i in range(14, 19)])
        worst = max(worst, float(np.abs(multi - single).max()))
    engine.reset()
    return worst


def test_greedy_speculative_equals_greedy_with_no_drafter_on_50_prompts(engine, bundle, record_property):
    """Hybrid SD (the default: lookup drafts where the context repeats, the drafter elsewhere), drafter-model
    SD and prompt-lookup SD (which gets drafts accepted even from a weak pair) against the engine with no drafter
    loaded (what --no-speculation runs), token for token; that one against plain ONNX Runtime running the target
    graph alone (1-token steps, no IO binding) on every fifth prompt."""
    from benchmarks.one_distribution import PlainORT

    disc = _discrepancy(engine, bundle)
    assert engine.manifest.target.batch_invariant_rows == 1 and engine.target.min_rows == 1
    assert disc == 0.0  # a 5-token verify pass and five 1-token steps agree bit for bit, with no runtime padding
    plain = Engine.load(bundle, drafting="none", max_context=256)
    assert plain.drafter is None and plain.plan.mode == "ar"
    lookup = Engine.load(bundle, drafting="lookup", max_context=256)
    model = Engine.load(bundle, drafting="model", max_context=256)
    ort_run = PlainORT(bundle / engine.manifest.target.graph, engine.manifest.target)
    mismatches, ort_mismatches, drafted, accepted = [], [], 0, 0
    assert len(PROMPTS) >= 50
    cfg = {"max_new_tokens": 24, "stop_token_ids": ()}
    for i, prompt in enumerate(PROMPTS):
        ar = plain.generate(prompt, cfg).token_ids
        if i % 5 == 0 and list(ar) != ort_run.greedy(plain.tokenizer.encode(prompt).ids, len(ar), set()):
            ort_mismatches.append(prompt)
        for eng in (engine, model, lookup):
            r = eng.generate(prompt, cfg, draft_length=4)
            drafted, accepted = drafted + r.stats.drafted, accepted + r.stats.accepted
            if r.token_ids != ar:
                mismatches.append(prompt)
    runs = 3 * len(PROMPTS)
    record_property("greedy_mismatches", f"{len(mismatches)}/{runs}")
    print(f"\ngreedy SD vs no drafter: {len(mismatches)}/{runs} runs differ (hybrid, drafter model and prompt lookup, "
          f"{accepted}/{drafted} drafts accepted); no drafter vs plain ONNX Runtime: {len(ort_mismatches)} differ")
    assert 0 < accepted < drafted  # drafts both accepted and rejected
    assert engine.stats.lookup_drafted > 0 and model.stats.lookup_drafted == 0  # hybrid used lookup; "model" not
    assert not mismatches and not ort_mismatches, (mismatches[:3], ort_mismatches[:3])


def _real_pq(engine: Engine, bundle: Path, prompt: str):
    m = engine.manifest
    ids = engine.tokenizer.encode(prompt).ids
    p_logits, _ = plain_logits(bundle / m.target.graph, m.target, ids)
    q_logits, _ = plain_logits(bundle / m.drafter.graph, m.drafter, ids)
    id_map = None
    if m.vocab_trim is not None:
        id_map = np.load(bundle / m.vocab_trim.id_map).astype(np.int64)
    return ids, p_logits[-1:], q_logits[-1:], id_map


def _chi2(counts: np.ndarray, p: np.ndarray) -> float:
    """Chi-square p-value of ``counts`` against ``p``, tokens pooled (most likely first) into bins of
    expected count >= max(5, n/20) so that flat distributions still give a valid test."""
    from scipy.stats import chisquare

    n = counts.sum()
    order = np.argsort(-p, kind="stable")
    target = max(5.0, n / 20)
    exp, obs, e, o = [], [], 0.0, 0.0
    for t in order:
        e += p[t] * n
        o += counts[t]
        if e >= target:
            exp.append(e)
            obs.append(o)
            e = o = 0.0
    if e > 0 or o > 0:
        exp[-1] += e
        obs[-1] += o
    assert len(exp) >= 2
    exp = np.array(exp)
    return chisquare(obs, exp * n / exp.sum()).pvalue


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7), SamplingConfig(0.7, top_p=0.9)])
def test_verify_with_real_p_and_q_is_distributed_as_p(engine, bundle, cfg):
    if engine.drafter is None:
        pytest.skip("the plan has no drafter model")
    _, p_logits, q_logits, id_map = _real_pq(engine, bundle, "Once upon a time there was")
    p = probs(p_logits.astype(np.float64), cfg)
    q = probs(q_logits.astype(np.float64), cfg)  # over the drafter's (maybe trimmed) vocabulary
    q_full = np.zeros(p.shape[1])  # q over target ids, as the decoder races it
    q_full[id_map if id_map is not None else slice(None)] = q[0]
    noise = Noise(0, p.shape[1])
    counts = np.zeros(p.shape[1])
    accepted = 0
    for pos in range(20000):
        x = noise.race(q_full, pos)
        acc, nxt = verify(np.vstack([p, p]), [x], noise, pos)
        counts[x if acc else nxt] += 1
        accepted += acc
    assert counts[p[0] == 0].sum() == 0
    assert _chi2(counts, p[0]) > 1e-3
    tv = 0.5 * np.abs(p[0] - q_full).sum()
    assert accepted / 20000 > (1 - tv) / (1 + tv) - 0.02  # the coupling's acceptance guarantee


def test_sampled_speculative_first_token_is_distributed_as_p(engine, bundle):
    """End to end (sessions, trimmed drafter, loop); the verify tests above cover T=1.0 / 0.7 / top-p with power."""
    cfg = SamplingConfig(0.7, top_p=0.9)
    prompt = "Once upon a time there was"
    ids, p_logits, _, _ = _real_pq(engine, bundle, prompt)
    p = probs(p_logits.astype(np.float64), cfg)[0]
    counts = np.zeros(len(p))
    drafted = 0
    for seed in range(300):
        r = engine.generate(ids, max_new_tokens=4, temperature=cfg.temperature, top_p=cfg.top_p, seed=seed,
                            draft_length=3, config={"stop_token_ids": ()})
        counts[r.token_ids[0]] += 1
        drafted += r.stats.drafted
    assert drafted >= 300  # the first token really went through draft + verify
    assert counts[p == 0].sum() == 0
    assert _chi2(counts, p) > 1e-3


def test_sampled_speculative_and_drafter_less_engines_draw_from_one_distribution(engine, bundle):
    """The first two tokens at T=0.7 / top-p 0.9: 400 seeded draws from the speculative engine and 400 (other seeds)
    from the bundle loaded with no drafter, each against the joint p of plain ONNX Runtime's 1-token passes, and
    against each other (chi-square test of homogeneity on the same pooled bins)."""
    from scipy.stats import chi2_contingency

    from benchmarks.one_distribution import PlainORT, _bins, exact_joint

    plain = Engine.load(bundle, drafting="none", max_context=256)
    cfg = SamplingConfig(0.7, top_p=0.9)
    ids = engine.tokenizer.encode("Once upon a time there was").ids
    m = engine.manifest
    p_all, index, _ = exact_joint(PlainORT(bundle / m.target.graph, m.target), ids, cfg, max_first=50)
    n = 400
    bins = _bins(p_all, n)
    k = bins.max() + 1
    observed = []
    for eng, base in ((engine, 0), (plain, 10_000)):
        c = np.zeros(len(p_all))
        for seed in range(base, base + n):
            a, b = eng.generate(ids, {"stop_token_ids": ()}, max_new_tokens=2, temperature=0.7, top_p=0.9,
                                seed=seed).token_ids[:2]
            c[index(a, b)] += 1
        assert c[p_all == 0].sum() == 0
        obs = np.bincount(bins[bins >= 0], weights=c[bins >= 0], minlength=k)
        exp = np.bincount(bins[bins >= 0], weights=p_all[bins >= 0], minlength=k)
        assert _chi2_binned(obs, exp) > 1e-3
        observed.append(obs)
    table = np.vstack(observed)
    assert chi2_contingency(table[:, table.sum(0) > 0])[1] > 1e-3


def _chi2_binned(obs: np.ndarray, exp: np.ndarray) -> float:
    from scipy.stats import chisquare

    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_kv_after_rewind_matches_fresh_run(engine, bundle):
    r = engine.generate("The cat sat on", max_new_tokens=40, temperature=1.0, seed=3, draft_length=4,
                        config={"stop_token_ids": ()})
    assert r.stats.accepted < r.stats.drafted  # some drafts were rejected and rolled back
    committed = engine.context
    n = engine.target.length
    assert n == len(committed) - 1
    _, present = plain_logits(bundle / engine.manifest.target.graph, engine.manifest.target, committed[:n])
    worst = 0.0
    kv = engine.target.kv
    for layer in range(engine.manifest.target.num_layers):  # present also holds the graph's own extra row: cut it
        worst = max(worst, float(np.abs(kv.keys[layer][:, :, :n] - present[f"present.{layer}.key"][:, :, :n]).max()),
                    float(np.abs(kv.values[layer][:, :, :n] - present[f"present.{layer}.value"][:, :, :n]).max()))
    assert worst < 0.05, worst  # chunked vs one-pass int8-activation noise, not stale drafts (those are O(1))


def test_device_fallback_and_strict(bundle):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = Engine.load(bundle, device="cuda", max_context=256)
    assert e.devices["target"] == "cpu"
    assert any("falling back to CPU" in str(w.message) for w in caught)
    with pytest.raises(EdgeSpecError, match="CUDAExecutionProvider"):
        Engine.load(bundle, device="cuda", strict=True, max_context=256)
    with pytest.raises(EdgeSpecError, match="Unknown device"):
        Engine.load(bundle, device="tpu")
    e2 = Engine.load(bundle, drafter_device="openvino", max_context=256)  # drafter alone falls back
    assert e2.generate("Hi", max_new_tokens=3).token_ids


def test_threads_and_spin_reach_both_sessions(bundle):
    """Engine.load(threads=, spin=, drafter_threads=) set ONNX Runtime's pool sizes and spinning. By default the target
    takes every core and spins when it has more than one thread; the drafter runs on one thread (runtime/options.py)."""
    import os

    key = "session.intra_op.allow_spinning"
    many = (os.cpu_count() or 1) > 1
    default = Engine.load(bundle, max_context=256, drafting="model")
    quiet = Engine.load(bundle, max_context=256, drafting="model", spin=False)
    fast = Engine.load(bundle, max_context=256, drafting="model", threads=1, spin=True, drafter_threads=2)
    expect = {  # engine: ((target threads, spin), (drafter threads, spin))
        "default": (default, (0, "1" if many else "0"), (1, "0")),
        "no spin": (quiet, (0, "0"), (1, "0")),
        "given": (fast, (1, "1"), (2, "1")),
    }
    for name, (e, (t_threads, t_spin), (d_threads, d_spin)) in expect.items():
        for s, threads, spin in ((e.target.session, t_threads, t_spin), (e.drafter.session, d_threads, d_spin)):
            opts = s.get_session_options()
            assert (opts.intra_op_num_threads, opts.get_session_config_entry(key)) == (threads, spin), name
    assert fast.generate("def add(a, b):", max_new_tokens=8).token_ids == \
        default.generate("def add(a, b):", max_new_tokens=8).token_ids


def test_interrupted_stream_then_next_call_is_consistent(engine):
    engine.reset()
    stream = engine.stream("Dear friend,", max_new_tokens=50, draft_length=4, config={"stop_token_ids": ()})
    got = []
    for i, ev in enumerate(stream):
        got.extend(ev.token_ids)
        if i == 2:
            break  # the consumer walks away
    stream.close()
    ctx = engine.context
    assert ctx[-len(got):] == got and engine.target.length == len(ctx) - 1
    # a KeyboardInterrupt in the middle of a step (inside the target pass)
    real = engine.target.forward
    calls = {"n": 0}

    def flaky(tokens):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(tokens)

    engine.target.forward = flaky
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate(ctx, max_new_tokens=30, draft_length=4, config={"stop_token_ids": ()})
    finally:
        del engine.target.forward
    after = engine.generate(ctx, max_new_tokens=12, config={"stop_token_ids": ()}).token_ids
    engine.reset()
    fresh = engine.generate(ctx, max_new_tokens=12, speculative=False, config={"stop_token_ids": ()}).token_ids
    assert after == fresh


def test_chat_reuses_kv_across_turns(engine):
    engine.reset()
    msgs = [{"role": "user", "content": "Hello there."}]
    first = engine.chat(msgs, max_new_tokens=16)
    held = engine.context  # prompt + generated ids of turn one
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    second = engine.chat(msgs, max_new_tokens=16)
    st = engine.last_stats
    # The generated ids are kept (not re-tokenized), so all of turn one's KV is reused.
    assert engine.context[:len(held)] == held
    assert st.reused_tokens >= len(held) - 1
    prompt = engine.context[:len(engine.context) - len(second.token_ids)]
    engine.reset()
    assert engine.generate(prompt, max_new_tokens=16).token_ids == second.token_ids
    with pytest.raises(EdgeSpecError, match="role"):
        engine.chat([{"role": "wizard", "content": "x"}])


def test_streaming_text_is_whole_and_stop_strings_cut(engine):
    # reset() before each call: the same seed reproduces the same text from the same KV state (a
    # different prefill chunking moves logits by ~1e-6, enough to move a draw on a flat p)
    engine.reset()
    events = list(engine.stream("Hello, my name is", max_new_tokens=60, temperature=1.0, seed=7, draft_length=3,
                                config={"stop_token_ids": ()}))
    assert all("\ufffd" not in e.text for e in events)
    text = "".join(e.text for e in events)
    engine.reset()
    r = engine.generate("Hello, my name is", max_new_tokens=60, temperature=1.0, seed=7, draft_length=3,
                        config={"stop_token_ids": ()})
    assert r.text == text and r.token_ids == tuple(t for e in events for t in e.token_ids)
    assert r.stats.drafted > 0
    if len(text) > 8:
        stop = text[5:8]
        engine.reset()
        cut = engine.generate("Hello, my name is", max_new_tokens=60, temperature=1.0, seed=7, stop=[stop],
                              draft_length=3,
                              config={"stop_token_ids": ()})
        assert cut.finish_reason == "stop_string" and cut.text == text[:text.find(stop)]


def test_generation_config_rejects_unknown_keys(engine):
    with pytest.raises(EdgeSpecError, match="Unknown generation option 'temprature'"):
        engine.generate("Hi", {"temprature": 0.5})
    with pytest.raises(EdgeSpecError, match="prompt is"):
        engine.generate("word " * 5000)


def test_context_full_finishes_cleanly(bundle):
    e = Engine.load(bundle, max_context=160)
    with pytest.warns(RuntimeWarning, match="context is full"):
        r = e.generate("Once upon a time", max_new_tokens=400, config={"stop_token_ids": ()})
    assert r.finish_reason == "context_full" and len(e.context) == 161


def test_hybrid_drafting_is_the_default_and_model_opts_out(bundle):
    """drafting="auto" with a drafter: lookup drafts on a repetitive prompt, counted apart in the stats;
    drafting="model": only the drafter drafts. Same greedy output either way, and as plain decoding."""
    prompt = "a b c d a b c d a b c d a b"
    cfg = {"stop_token_ids": ()}
    auto, model = Engine.load(bundle, max_context=256), Engine.load(bundle, drafting="model", max_context=256)
    assert auto.plan.mode == model.plan.mode == "speculative"
    a = auto.generate(prompt, cfg, max_new_tokens=30, draft_length=4)
    m = model.generate(prompt, cfg, max_new_tokens=30, draft_length=4)
    ar = auto.generate(prompt, cfg, max_new_tokens=30, speculative=False)
    assert a.token_ids == m.token_ids == ar.token_ids
    assert 0 < a.stats.lookup_drafted <= a.stats.drafted and a.stats.lookup_accepted <= a.stats.lookup_drafted
    assert m.stats.lookup_drafted == 0 and m.stats.drafted > 0


def test_lookup_rung_generates_like_ar(bundle):
    e = Engine.load(bundle, drafting="lookup", max_context=512)
    assert e.plan.mode == "lookup" and e.drafter is None
    prompt = "a b c d a b c d a b c d a b"
    sd = e.generate(prompt, max_new_tokens=30, draft_length=4, config={"stop_token_ids": ()})
    ar = e.generate(prompt, max_new_tokens=30, speculative=False, config={"stop_token_ids": ()})
    assert sd.token_ids == ar.token_ids or sd.stats.drafted > 0
