"""Pure sampling functions: the shared transform, and the lossless verify rule (chi-square against p)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.sampling import SamplingConfig, probs, sample, verify, verify_greedy

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


def test_sample_never_picks_zero_mass():
    rng = np.random.default_rng(0)
    p = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    draws = {sample(p, rng) for _ in range(2000)}
    assert draws == {1, 3}


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
    counts = np.zeros(v)
    for _ in range(n):
        j = sample(q[0], rng)
        x = int(id_map[j]) if trimmed else j
        acc, nxt = verify(p, q, [x], rng, id_map, [j] if trimmed else None)
        counts[x if acc == 1 else nxt] += 1
    assert counts[p[0] == 0].sum() == 0
    assert _chi2_ok(counts, p[0], n) > 1e-3


def test_verify_deterministic_drafts_are_lossless():
    """Prompt-lookup drafts (q one-hot) keep the output distributed as p."""
    rng = np.random.default_rng(2)
    p = probs(rng.normal(0, 1.5, size=(2, 32)), SamplingConfig(1.0))
    counts = np.zeros(32)
    n = 5000
    for _ in range(n):
        acc, nxt = verify(p, None, [7], rng)
        counts[7 if acc == 1 else nxt] += 1
    assert _chi2_ok(counts, p[0], n) > 1e-3


def test_verify_bonus_after_all_accepted():
    p = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q = np.array([[0.0, 1.0, 0.0]])
    assert verify(p, q, [1], np.random.default_rng(0)) == (1, 2)
