"""Pure sampling functions: the logits transform, seeded sampling (:class:`Noise`), and the lossless verify rule.

Notation (GUIDE §4): p = target distribution, q = drafter distribution. Both are produced by
the *same* :func:`probs` transform (temperature, then top-k, top-p and min-p) and sampled with the
same per-position noise, so a draft is accepted whenever the drafter's race picks the token the
target's race picks. Sampled output depends on (seed, prompt, settings) only, never on γ.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np

from edge_spec.sampling_config import SamplingConfig

# 1/T beyond this is clamped: logits are shifted so the largest is 0 and then scaled, so a tiny T
# (even 1e-45, whose inverse overflows) gives a near one-hot distribution, never inf * 0 = NaN.
_MAX_INV_TEMPERATURE = 1e30


class Uniform(Protocol):
    """A source of uniform draws: ``random()`` -> a float in [0, 1) (``random.Random``, numpy's ``Generator``)."""

    def random(self) -> float: ...


# Sampled drafts are drawn from q at this fraction of the target's temperature (same filters). Any q keeps the output
# exact: the coupling and the rejection rule are lossless whatever q the drafts come from, as long as the rejection
# rule is given that q. A somewhat sharper q bets more often on the drafter's best guess; much sharper, it stops
# covering the target's spread. Demo bundle, 32 chat prompts, seeded, gamma=1 (benchmarks/distill_acceptance.py
# --draft-ratios): at T = 0.7 / 0.8 / 1.0, drafts at 1.0x accepted 0.380 / 0.339 / 0.299, at 0.7x 0.387 / 0.343 /
# 0.311, at 0.5x 0.382 / 0.334 / 0.295, the drafter's argmax 0.363 / 0.303 / 0.227.
DRAFT_TEMPERATURE_RATIO = 0.7


def draft_sampling(cfg: SamplingConfig, temperature: float | None = None) -> SamplingConfig:
    """The drafter's sampling for a target sampled with ``cfg``: the same filters at ``temperature`` (None:
    ``DRAFT_TEMPERATURE_RATIO`` x cfg's). A greedy target drafts greedily whatever ``temperature`` says; a
    temperature of 0 drafts the drafter's argmax (deterministic drafts, as llama.cpp drafts)."""
    if cfg.greedy:
        return cfg
    t = cfg.temperature * DRAFT_TEMPERATURE_RATIO if temperature is None else temperature
    return SamplingConfig(t, cfg.top_k, cfg.top_p, cfg.min_p)


def top_probability(logits: np.ndarray, cfg: SamplingConfig) -> float:
    """The largest probability of one row of ``logits`` [V] at ``cfg``'s temperature (1 when greedy), before
    filters: the drafter's confidence the draft gate compares with its threshold."""
    inv_t = min(1.0 / cfg.temperature, _MAX_INV_TEMPERATURE) if cfg.temperature > 0 else 1.0
    return 1.0 / float(np.exp((logits - logits.max()) * inv_t).sum())


def probs(logits: np.ndarray, cfg: SamplingConfig, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of logits ``[rows, V]`` -> rows of probabilities after temperature, top-k, top-p and min-p.

    The order is transformers' (temperature first, then the filters); min-p keeps the tokens whose
    probability is at least ``min_p`` times the likeliest one's (after the earlier filters).
    ``out`` (float32 or float64, same shape) is reused when given. Ties at the top-k / top-p cut
    are all kept, so the result is a deterministic function of the logits.
    """
    if out is None:
        out = np.empty(logits.shape, dtype=np.float64)
    np.subtract(logits, logits.max(axis=-1, keepdims=True), out=out)  # <= 0, the largest exactly 0
    out *= min(1.0 / cfg.temperature, _MAX_INV_TEMPERATURE) if cfg.temperature > 0 else 1.0
    if 0 < cfg.top_k < out.shape[-1]:
        for row in out:  # the later filters on the k kept tokens only, not on the whole vocabulary
            _top_k_row(row, cfg)
        return out
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0 or cfg.min_p > 0.0:
        for row in out:
            _top_p_min_p(row, cfg)
    return out


class RowProbs:
    """:func:`probs` of ``logits`` [rows, V] computed a row at a time, when a row is first read (``p[i]``,
    ``p[i, x]``), into ``out`` [rows, V]. Verification reads rows in order and stops at the first rejection, so a
    verify pass of g drafts pays for the rows it reaches (accepted + 1), not g + 1 softmaxes over the vocabulary;
    each row is the same function of its logits as in a one-row pass."""

    def __init__(self, logits: np.ndarray, cfg: SamplingConfig, out: np.ndarray) -> None:
        self.logits, self.cfg, self.out = logits, cfg, out
        self.done = np.zeros(len(logits), dtype=bool)

    def row(self, i: int) -> np.ndarray:
        if not self.done[i]:
            probs(self.logits[i:i + 1], self.cfg, out=self.out[i:i + 1])
            self.done[i] = True
        return self.out[i]

    def __getitem__(self, key: int | tuple[int, int]) -> np.ndarray | np.floating:
        if isinstance(key, tuple):
            return self.row(int(key[0]))[key[1]]
        return self.row(int(key))


def _top_k_row(row: np.ndarray, cfg: SamplingConfig) -> None:
    """One row of :func:`probs` with top-k, in place: ``row`` [V] (tempered logits, max 0) -> probabilities.

    The same filters in the same order as the full-vocabulary path, on the tokens at or above the k-th value (ties
    kept): softmax, top-p, min-p; every other token gets 0. With the chat defaults (top-k 40, top-p, min-p) this is
    ~0.1 ms a row instead of several (a partition over 49k mostly-zero probabilities was the slow part)."""
    kth = np.partition(row, -cfg.top_k)[-cfg.top_k]
    idx = np.flatnonzero(row >= kth)
    p = np.exp(row[idx])
    p /= p.sum()
    _top_p_min_p(p, cfg)
    row.fill(0.0)
    row[idx] = p


def _top_p_min_p(p: np.ndarray, cfg: SamplingConfig) -> None:
    """Top-p, then min-p, in place on one row of probabilities ``p`` [n] (the whole vocabulary or top-k's kept
    tokens), renormalised after each filter that applies."""
    if cfg.top_p < 1.0:
        p[p < _nucleus_cut(p, cfg.top_p)] = 0.0
        p /= p.sum()
    if cfg.min_p > 0.0:
        p[p < cfg.min_p * p.max()] = 0.0
        p /= p.sum()


def _nucleus_cut(row: np.ndarray, top_p: float) -> float:
    """The smallest probability kept by top-p: the nucleus is the shortest prefix of the
    descending order whose mass reaches top_p (every token tied with its last one is kept).

    Nuclei are usually short, so partition out the top m (O(V)) and sort only those, doubling m
    until they hold the mass; a full sort of the vocabulary is the fallback."""
    n = len(row)
    target = top_p * float(row.sum())
    m = 64
    while m < n // 4:
        top = np.partition(row, n - m)[n - m:]
        desc = np.sort(top)[::-1]
        cum = np.cumsum(desc, dtype=np.float64)
        if cum[-1] >= target:
            return float(desc[min(int(np.searchsorted(cum, target)), m - 1)])
        m *= 4
    desc = np.sort(row)[::-1]
    cum = np.cumsum(desc, dtype=np.float64)
    return float(desc[min(int(np.searchsorted(cum, target)), n - 1)])


_B = 128  # tokens per noise block
_SLOTS = _B + 2  # counters per block: its minimum, where the minimum is, one per token
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _uniform(key: np.uint64, counters: np.ndarray) -> np.ndarray:
    """SplitMix64 output number ``counters`` of the stream ``key``, as float64 uniforms in the open (0, 1).

    Counter-based: any (position, token) draw is computed on its own, in any order, by either model."""
    x = counters * _GOLDEN  # uint64 arithmetic wraps, as SplitMix64 wants
    x += key
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


class Noise:
    """Exponential noise E[pos, v] ~ Exp(1), one per (position, token id), fixed by a seed.

    Sampling is the exponential race: the token at position ``pos`` is argmin_v E[pos, v] / w[v],
    which is distributed as norm(w) (the Gumbel-max trick in another form). Drafter and target
    race with the *same* noise, so a drafted token is accepted exactly when it is the token plain
    sampling from p would have chosen: the output is a function of (seed, prompt, settings) alone,
    whatever draft lengths the adaptive policy picks (Daliri et al. 2024, drafter-invariant
    speculative decoding).

    The noise is generated per block of 128 tokens: first the block's minimum (the minimum of n
    iid Exp(1) is Exp(1)/n, at a uniform place), then, only if needed, the others as that minimum
    plus Exp(1) (memorylessness) — the same joint law as n independent draws. A block whose
    largest weight over its minimum cannot beat the best ratio so far is never expanded, so a
    race reads w once (a block max) and draws a few hundred numbers, not one per token.
    """

    def __init__(self, seed: int, vocab_size: int) -> None:
        # 64 well-mixed bits of the seed (hashlib, not numpy.random: the lean runtime does not import numpy's
        # random module, ~6.5 MiB resident)
        self.key = np.uint64(int.from_bytes(hashlib.blake2b(str(int(seed)).encode(), digest_size=8,
                                                            person=b"edge-spec-noise").digest(), "little"))
        self.nblocks = -(-vocab_size // _B)
        self.starts = np.arange(0, vocab_size, _B)  # [nblocks] first token of each block
        self.sizes = np.minimum(_B, vocab_size - self.starts)  # [nblocks]
        self._block_ctr = np.arange(self.nblocks, dtype=np.uint64) * np.uint64(_SLOTS)  # [nblocks]
        self._token_ctr = np.arange(1, _B + 2, dtype=np.uint64)  # [B + 1] slot 1: where the minimum is; 2..: tokens

    def race(self, w: np.ndarray, pos: int) -> int:
        """The race winner at ``pos`` for non-negative weights ``w`` ``[V]`` (not all zero): a draw from norm(w).

        Written as argmax w / E (E > 0 always), so zero weights need no special case and nothing warns."""
        ctr = self._block_ctr + np.uint64(pos * self.nblocks * _SLOTS)  # [nblocks]
        m = -np.log(_uniform(self.key, ctr)) / self.sizes  # [nblocks] each block's smallest E
        ub = np.maximum.reduceat(w, self.starts) / m  # [nblocks] no token of the block can do better
        best_r, best_v = -1.0, -1
        while True:
            b = int(ub.argmax())
            if not ub[b] > best_r:
                return best_v
            ub[b] = -1.0
            s, n = int(self.starts[b]), int(self.sizes[b])
            u = _uniform(self.key, ctr[b] + self._token_ctr[:n + 1])  # [n + 1] where the minimum is, then tokens
            e = m[b] - np.log(u[1:])  # [n] the block's other draws: its minimum plus Exp(1)
            e[int(u[0] * n)] = m[b]
            r = w[s:s + n] / e
            j = int(r.argmax())
            if r[j] > best_r:
                best_r, best_v = float(r[j]), s + j


def verify_greedy(p_logits: np.ndarray, drafted: np.ndarray | list[int]) -> tuple[int, int]:
    """Greedy verification: accept the longest prefix of drafts that equals the target's argmax.

    ``p_logits`` ``[g + 1, V]`` are the target logits at the g draft positions plus the bonus
    position. Returns ``(accepted, next_token)``; next_token is the correction or the bonus.
    """
    best = p_logits.argmax(axis=-1)
    n = 0
    for x in drafted:
        if best[n] != x:
            break
        n += 1
    return n, int(best[n])


def verify(p: np.ndarray, drafted: np.ndarray | list[int], noise: Noise, pos: int) -> tuple[int, int]:
    """Lossless verification by coupling: every committed token is the one plain sampling would give.

    * ``p`` ``[g + 1, V]``: target probabilities at the g draft positions and the bonus position.
    * ``drafted``: the g drafted tokens (target ids), drawn by racing q with the same ``noise``
      (or deterministic, from prompt lookup).
    * ``pos``: absolute position of the first draft in the context (its index in the token list).

    The token at position pos + i is ``noise.race(p[i], pos + i)``: distributed as p, and the same
    whether or not a draft was made there. A draft is accepted iff it equals that token; the first
    mismatch is replaced by it, and after g accepts it is the bonus. With the same noise the drafter
    proposes x = race(q) and P(accept) >= (1 - TV(p, q)) / (1 + TV(p, q)); for a deterministic
    draft x it is p(x), as with the rejection rule. Returns ``(accepted, next_token)``.
    """
    g = len(drafted)
    for i in range(g):
        y = noise.race(p[i], pos + i)
        if y != int(drafted[i]):
            return i, y
    return g, noise.race(p[g], pos + g)


class Rejection:
    """Speculative sampling with the rejection rule (Leviathan et al. / Chen et al.), for unseeded calls.

    Accept drafted x with probability min(1, p(x) / q(x)); on rejection sample from
    norm(max(0, p - q)); after g accepts sample the bonus from p. Exactly p-distributed, with the
    highest acceptance any lossless rule has: 1 - TV(p, q), against >= (1 - TV) / (1 + TV) for the
    seeded coupling (:class:`Noise`). Its draws are consumed in order, so the output depends on the
    draft lengths — which is why a call with a seed uses :class:`Noise` instead.
    """

    keeps_q = True  # verify needs q at each draft position

    def __init__(self, rng: Uniform) -> None:
        self.rng = rng  # anything with random() -> a float in [0, 1): random.Random, numpy's Generator

    def race(self, w: np.ndarray, pos: int) -> int:
        """A draw from norm(w) ``[V]`` (``pos`` unused: draws are consumed in order)."""
        c = np.cumsum(w, dtype=np.float64)  # [V]
        return int(min(np.searchsorted(c, self.rng.random() * c[-1], side="right"), len(w) - 1))


Noise.keeps_q = False  # the coupling never needs q after the draft is drawn


def verify_rejection(p: np.ndarray, q: np.ndarray | None, drafted: np.ndarray | list[int],
                     sampler: Rejection) -> tuple[int, int]:
    """The rejection rule over g drafts.

    * ``p`` ``[g + 1, V]``: target probabilities at the draft positions and the bonus position.
    * ``q`` ``[g, V]``: drafter probabilities over target ids (0 outside a trimmed set) at the draft
      positions, or None for deterministic drafts (prompt lookup: q is one-hot at the draft).
    Returns ``(accepted, next_token)``.
    """
    g = len(drafted)
    for i in range(g):
        x = int(drafted[i])
        qx = 1.0 if q is None else float(q[i, x])
        px = float(p[i, x])
        if qx > 0 and sampler.rng.random() * qx < px:  # u < p/q, division-free
            continue
        if q is None:
            resid = p[i].astype(np.float64)  # [V] max(0, p - onehot(x)) = p without x
            resid[x] = 0.0
        else:
            resid = np.maximum(p[i].astype(np.float64) - q[i], 0.0)  # [V]
        if not resid.sum() > 0:  # p == q up to rounding: any draw from p is exact
            resid = p[i].astype(np.float64)
        return i, sampler.race(resid, 0)
    return g, sampler.race(p[g], 0)
