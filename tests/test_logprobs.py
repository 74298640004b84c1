"""Log-probabilities of generated tokens (issue 46): from the verify pass's target logits, equal in speculative and
plain decoding, equal to a softmax of the target graph run by plain ONNX Runtime, computed only when asked for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import read_manifest
from edge_spec.errors import EdgeSpecError
from edge_spec.runtime import speculative
from edge_spec.runtime.engine import Engine
from edge_spec.runtime.logprobs import log_distribution, top_tokens
from edge_spec.runtime.sampling import SamplingConfig, probs
from tests.test_runtime_support import plain_logits

PROMPTS = ["def add(a, b):", "import os\nimport sys\n\ndef main():", "class Stack:\n    def push(self, x):"]


@pytest.fixture(scope="module")
def engine(demo_bundle: Path) -> Engine:
    return Engine.load(demo_bundle, max_context=256)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_logprobs_equal_in_speculative_and_plain_decoding(engine: Engine, prompt: str) -> None:
    spec = engine.generate(prompt, max_new_tokens=32, temperature=0, logprobs=5)
    plain = engine.generate(prompt, max_new_tokens=32, temperature=0, logprobs=5, speculative=False)
    assert spec.stats.accepted > 0 and plain.stats.drafted == 0  # the two really decoded differently
    assert spec.token_ids == plain.token_ids
    assert len(spec.logprobs) == len(spec.token_ids)
    assert spec.logprobs == plain.logprobs  # bit for bit: the same target rows, whatever pass computed them
    for lp, token in zip(spec.logprobs, spec.token_ids):
        assert lp.token == token and len(lp.top) == 5
        assert lp.top[0] == (token, lp.logprob)  # greedy: the token is the likeliest
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)


def test_streamed_events_carry_the_same_values(engine: Engine) -> None:
    whole = engine.generate(PROMPTS[0], max_new_tokens=24, temperature=0, logprobs=3)
    events = list(engine.stream(PROMPTS[0], max_new_tokens=24, temperature=0, logprobs=3))
    assert all(len(ev.logprobs) == len(ev.token_ids) for ev in events)
    assert tuple(lp for ev in events for lp in ev.logprobs) == whole.logprobs


def test_values_are_a_softmax_of_the_target_graph_run_by_plain_onnxruntime(demo_bundle: Path, engine: Engine) -> None:
    m = read_manifest(demo_bundle)
    prompt = engine.tokenizer.encode(PROMPTS[1]).ids
    got = engine.generate(prompt, max_new_tokens=6, temperature=0, logprobs=4)
    for k, lp in enumerate(got.logprobs):
        logits, _ = plain_logits(demo_bundle / m.target.graph, m.target, prompt + list(got.token_ids[:k]))
        row = logits[-1].astype(np.float64)
        want = row - row.max() - np.log(np.exp(row - row.max()).sum())  # log-softmax at T = 1, no filter
        assert lp.logprob == pytest.approx(want[lp.token], abs=1e-5)
        best = np.argsort(-want, kind="stable")[:4]
        assert [t for t, _ in lp.top] == best.tolist()
        assert [v for _, v in lp.top] == pytest.approx(want[best].tolist(), abs=1e-5)


def test_sampled_values_are_the_filtered_distribution_and_agree_across_modes(engine: Engine) -> None:
    kw = {"max_new_tokens": 24, "temperature": 0.8, "top_k": 4, "seed": 7, "logprobs": 6}
    spec = engine.generate(PROMPTS[2], **kw)
    plain = engine.generate(PROMPTS[2], speculative=False, **kw)
    assert spec.token_ids == plain.token_ids and spec.logprobs == plain.logprobs  # seeded: same tokens either way
    for lp in spec.logprobs:
        assert 1 <= len(lp.top) <= 4  # top-k removed the rest: they have probability 0 and are not listed
        assert sum(np.exp(v) for _, v in lp.top) == pytest.approx(1.0, abs=1e-9)
        assert (lp.token, lp.logprob) in lp.top


def test_log_distribution_is_what_sampling_draws_from() -> None:
    rng = np.random.default_rng(0)
    row = rng.normal(size=300).astype(np.float32) * 3
    for cfg in (SamplingConfig(0.7, 20, 0.9, 0.0), SamplingConfig(1.3, 0, 0.95, 0.05), SamplingConfig(0.5)):
        lp = log_distribution(row, cfg)
        p = probs(row[None].astype(np.float64), cfg)[0]
        assert np.array_equal(np.isfinite(lp), p > 0)
        assert np.allclose(np.exp(lp[p > 0]), p[p > 0], rtol=1e-12)
    greedy = log_distribution(row, SamplingConfig(0.0))
    assert np.allclose(np.exp(greedy), probs(row[None].astype(np.float64), SamplingConfig(1.0))[0])
    tied = np.array([0.0, -1.0, -0.5, -0.5, -0.5, -3.0])
    assert [t for t, _ in top_tokens(tied, 3)] == [0, 2, 3]  # ties go to the lower id, as argmax does
    assert top_tokens(np.array([-np.inf, -1.0, -np.inf]), 5) == ((1, -1.0),)


def test_nothing_is_computed_unless_asked(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("logprobs were computed although nobody asked")

    monkeypatch.setattr(speculative, "token_logprobs", refuse)
    result = engine.generate(PROMPTS[0], max_new_tokens=16, temperature=0)
    assert result.token_ids and result.logprobs == ()


@pytest.mark.parametrize("bad", [21, -1, 2.0, "5", True])
def test_bad_logprobs_option_is_one_sentence(engine: Engine, bad: object) -> None:
    with pytest.raises(EdgeSpecError, match=r"logprobs=.* must be None \(off\) or a whole number"):
        engine.generate(PROMPTS[0], max_new_tokens=2, logprobs=bad)
