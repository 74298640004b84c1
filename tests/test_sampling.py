"""Pure sampling functions: the shared transform, the seeded race, and the lossless verify rule (chi-square vs p)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.sampling import (
    Noise,
    RowProbs,
    SamplingConfig,
    probs,
    top_probability,
    verify,
    verify_greedy,
)

scipy_stats = pytest.importorskip("scipy.stats")


def test_transform_temperature_top_k_top_p():
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    np.testing.assert_allclose(probs(logits, SamplingConfig(1.0))[0], [0.5, 0.2, 0.15, 0.1, 0.05])
    p = probs(logits, SamplingConfig(1.0, top_k=2))[0]
    np.testing.assert_allclose(p, [5 / 7, 2 / 7, 0, 0, 0])
    p = probs(logits, SamplingConfig(1.0, top_p=0.8))[0]  # 0.5 + 0.2 < 0.8 <= 0.85
    np.testing.assert_allclose(p, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    hot = probs(logits, SamplingConfig(0.5))[0]
    sq = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    np.testing.assert_allclose(hot, sq / sq.sum())
    with pytest.raises(EdgeSpecError):
        SamplingConfig(-1.0)
    with pytest.raises(EdgeSpecError):
        SamplingConfig(1.0, top_p=0.0)


@pytest.mark.parametrize("cfg", [SamplingConfig(0.7), SamplingConfig(0.8, top_k=40, top_p=0.95, min_p=0.05)],
                         ids=["plain", "filters"])
def test_row_probs_are_computed_when_read(cfg: SamplingConfig) -> None:
    """RowProbs: each row is probs() of that row alone, bit for bit, computed only when verification reaches it."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 300)).astype(np.float32) * 3
    lazy = RowProbs(logits, cfg, np.zeros((5, 300), np.float32))
    assert np.array_equal(lazy[2], probs(logits[2:3], cfg, out=np.zeros((1, 300), np.float32))[0])
    assert lazy[3, 7] == lazy.out[3, 7] and lazy.done.tolist() == [False, False, True, True, False]
    fresh = RowProbs(logits, cfg, np.zeros((5, 300), np.float32))
    noise = Noise(1, 300)
    first = noise.race(fresh[0], 10)
    wrong = (first + 1) % 300  # a first draft the race rejects: only row 0 is ever computed
    assert verify(fresh, [wrong, 3, 4, 5], noise, 10) == (0, first) and fresh.done.tolist() == [True] + [False] * 4


def _reference(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Temperature, top-k, softmax, top-p, min-p over the whole vocabulary, by full sorts (ties at a cut kept)."""
    out = []
    for row in logits.astype(np.float64):
        x = (row - row.max()) / cfg.temperature
        if 0 < cfg.top_k < len(x):
            x[x < np.sort(x)[-cfg.top_k]] = -np.inf
        p = np.exp(x) / np.exp(x).sum()
        if cfg.top_p < 1.0:
            desc = np.sort(p)[::-1]
            p[p < desc[min(int(np.searchsorted(np.cumsum(desc), cfg.top_p * p.sum())), len(p) - 1)]] = 0.0
            p /= p.sum()
        if cfg.min_p > 0:
            p[p < cfg.min_p * p.max()] = 0.0
            p /= p.sum()
        out.append(p)
    return np.array(out)


@pytest.mark.parametrize("cfg", [SamplingConfig(0.8, top_k=40, top_p=0.95, min_p=0.05), SamplingConfig(1.0, top_k=5),
                                 SamplingConfig(0.5, top_k=40, top_p=0.5), SamplingConfig(1.5, top_k=200, min_p=0.3)])
def test_top_k_works_on_the_kept_tokens_as_on_the_whole_vocabulary(cfg: SamplingConfig) -> None:
    """probs() with top-k does the later filters on the k kept tokens only (the chat defaults' fast path): same
    support, same probabilities as a full-vocabulary reference, ties at the k-th value kept."""
    rng = np.random.default_rng(0)
    for v, ties in ((49152, False), (1000, True), (300, False)):
        logits = rng.normal(0, 3, (3, v)).astype(np.float32)
        if ties:
            logits = np.round(logits)  # many tokens tied at the cut
        got = probs(logits, cfg, out=np.empty(logits.shape, np.float32))
        want = _reference(logits, cfg)
        assert ((got > 0) == (want > 0)).all()
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_race_never_picks_zero_mass_and_is_keyed_by_position():
    p = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    noise = Noise(0, len(p))
    draws = [noise.race(p, pos) for pos in range(2000)]
    assert set(draws) == {1, 3}
    assert draws == [Noise(0, len(p)).race(p, pos) for pos in range(2000)]  # same seed, same position -> same
    assert draws != [Noise(1, len(p)).race(p, pos) for pos in range(2000)]


@pytest.mark.parametrize("v", [5, 300, 1000])
def test_race_is_distributed_as_the_weights(v):
    """The blocked exponential race (blocks of 128, expanded lazily) draws from norm(w), also with zeros."""
    rng = np.random.default_rng(v)
    w = rng.gamma(0.3, size=v).astype(np.float32)
    w[rng.random(v) < 0.3] = 0.0
    noise, n = Noise(7, v), 6000
    counts = np.bincount([noise.race(w, pos) for pos in range(n)], minlength=v)
    p = w.astype(np.float64) / w.sum(dtype=np.float64)
    assert counts[p == 0].sum() == 0
    assert _chi2_ok(counts, p, n) > 1e-3


def test_tiny_temperature_is_near_greedy_not_nan():
    logits = np.array([[1.0, 3.0, 2.0, 3.0 - 1e-6]], dtype=np.float32)
    for t in (1e-38, 1e-45, 5e-324, 1e-300):
        p = probs(logits, SamplingConfig(t))
        assert np.isfinite(p).all() and p[0, 1] == 1.0
        p32 = probs(logits, SamplingConfig(t), out=np.empty_like(logits))
        assert np.isfinite(p32).all() and int(p32[0].argmax()) == 1
        assert top_probability(logits[0], SamplingConfig(t)) == 1.0  # the draft gate's reading: finite too
    assert top_probability(logits[0], SamplingConfig()) == pytest.approx(probs(logits, SamplingConfig(1.0))[0].max())


@pytest.mark.parametrize("bad", [{"temperature": "hot"}, {"temperature": float("inf")}, {"temperature": float("nan")},
                                 {"top_k": 2.5}, {"top_p": "x"}, {"top_k": True}])
def test_sampling_config_rejects_non_numbers_in_one_sentence(bad):
    with pytest.raises(EdgeSpecError):
        SamplingConfig(**bad)


def test_verify_greedy():
    logits = np.array([[0, 5, 1], [3, 0, 0], [0, 0, 9]], dtype=np.float32)
    assert verify_greedy(logits, [1, 0]) == (2, 2)
    assert verify_greedy(logits, [1, 2]) == (1, 0)
    assert verify_greedy(logits, [0, 0]) == (0, 1)


def _chi2_ok(counts: np.ndarray, p: np.ndarray, n: int) -> float:
    keep = p * n >= 5
    exp = np.append(p[keep], p[~keep].sum()) * n
    obs = np.append(counts[keep], counts[~keep].sum())
    return scipy_stats.chisquare(obs[exp > 0], exp[exp > 0] * obs.sum() / exp[exp > 0].sum()).pvalue


def _draft(q: np.ndarray, noise: Noise, pos: int, id_map: np.ndarray | None, v: int) -> int:
    """What the decoder drafts: race q (scattered to target ids when trimmed) with the target's noise."""
    if id_map is None:
        return noise.race(q, pos)
    full = np.zeros(v)
    full[id_map] = q
    return noise.race(full, pos)


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7), SamplingConfig(0.7, top_p=0.9),
                                 SamplingConfig(1.0, top_k=20)])
@pytest.mark.parametrize("trimmed", [False, True])
def test_verify_first_token_is_distributed_as_p(cfg, trimmed):
    """Draft one token from q (full or trimmed vocabulary), verify, compare the committed token with p."""
    rng = np.random.default_rng(1)
    v, n = 64, 6000
    target_logits = rng.normal(0, 2.0, size=(2, v))
    drafter_logits = target_logits + rng.normal(0, 1.0, size=(2, v))
    id_map = np.sort(rng.choice(v, size=40, replace=False)) if trimmed else None
    p = probs(target_logits, cfg)
    q = probs(drafter_logits[:1, id_map] if trimmed else drafter_logits[:1], cfg)
    noise = Noise(3, v)
    counts = np.zeros(v)
    accepted = 0
    for pos in range(n):
        x = _draft(q[0], noise, pos, id_map, v)
        acc, nxt = verify(p, [x], noise, pos)
        counts[x if acc == 1 else nxt] += 1
        accepted += acc
    assert counts[p[0] == 0].sum() == 0
    assert _chi2_ok(counts, p[0], n) > 1e-3
    # the coupling's guarantee: P(accept) >= (1 - TV) / (1 + TV), TV over target ids
    q_full = np.zeros(v)
    q_full[id_map if trimmed else slice(None)] = q[0]
    tv = 0.5 * np.abs(p[0] - q_full).sum()
    assert accepted / n > (1 - tv) / (1 + tv) - 0.03


def test_verify_deterministic_drafts_are_lossless():
    """Prompt-lookup drafts (q one-hot) keep the output distributed as p, accepted with probability p(x)."""
    rng = np.random.default_rng(2)
    p = probs(rng.normal(0, 1.5, size=(2, 32)), SamplingConfig(1.0))
    counts = np.zeros(32)
    noise, n, accepted = Noise(4, 32), 5000, 0
    for pos in range(n):
        acc, nxt = verify(p, [7], noise, pos)
        counts[7 if acc == 1 else nxt] += 1
        accepted += acc
    assert _chi2_ok(counts, p[0], n) > 1e-3
    assert abs(accepted / n - p[0, 7]) < 4 * np.sqrt(p[0, 7] / n) + 1e-3


def test_verify_bonus_after_all_accepted():
    p = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert verify(p, [1], Noise(0, 3), 0) == (1, 2)


def test_verified_token_does_not_depend_on_the_draft():
    """The committed token at a position is the plain sample there, whatever was drafted (determinism)."""
    rng = np.random.default_rng(5)
    p = probs(rng.normal(0, 1.0, size=(3, 50)), SamplingConfig(1.0))
    noise = Noise(11, 50)
    for pos in range(200):
        plain = [noise.race(p[i], pos + i) for i in range(3)]
        for drafted in ([], [plain[0]], plain[:2], [int(rng.integers(50)), 3]):
            acc, nxt = verify(p[:len(drafted) + 1], drafted, noise, pos)
            assert list(drafted[:acc]) + [nxt] == plain[:acc + 1]
