"""Pure sampling functions: the logits transform, sampling, and the lossless verify rule.

Notation (GUIDE §4): p = target distribution, q = drafter distribution. Both are produced by
the *same* :func:`probs` transform (temperature, then top-k, then top-p), because the
speculative rule only reproduces p if q is exactly the distribution the drafts were drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_spec.errors import EdgeSpecError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise EdgeSpecError(f"temperature={self.temperature} must be >= 0 (0 means greedy).")
        if self.top_k < 0:
            raise EdgeSpecError(f"top_k={self.top_k} must be >= 0 (0 turns it off).")
        if not 0.0 < self.top_p <= 1.0:
            raise EdgeSpecError(f"top_p={self.top_p} must be in (0, 1] (1 turns it off).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs(logits: np.ndarray, cfg: SamplingConfig, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of logits ``[rows, V]`` -> rows of probabilities after temperature, top-k and top-p.

    ``out`` (float32 or float64, same shape) is reused when given. Ties at the top-k / top-p cut
    are all kept, so the result is a deterministic function of the logits.
    """
    if out is None:
        out = np.empty(logits.shape, dtype=np.float64)
    np.multiply(logits, 1.0 / cfg.temperature if cfg.temperature > 0 else 1.0, out=out)
    if 0 < cfg.top_k < out.shape[-1]:
        kth = np.partition(out, -cfg.top_k, axis=-1)[:, -cfg.top_k][:, None]
        out[out < kth] = -np.inf
    out -= out.max(axis=-1, keepdims=True)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0:
        for row in out:
            cut = _nucleus_cut(row, cfg.top_p)
            row[row < cut] = 0.0
            row /= row.sum()
    return out


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


_BLOCK = 128


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw an index from a 1-D (not necessarily normalised) non-negative weight vector.

    Two-level inverse CDF: pick a block of 128 entries from the block sums, then an entry inside
    it. Reads the vector once (a reduction, not a full cumulative sum), in float64 sums."""
    n = len(p)
    if n <= 4 * _BLOCK:
        cum = np.cumsum(p, dtype=np.float64)
        # side="right": the first index whose cumulative mass exceeds u always has p > 0
        return min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), n - 1)
    blocks = np.add.reduceat(p, np.arange(0, n, _BLOCK), dtype=np.float64)
    cum = np.cumsum(blocks)
    u = rng.random() * cum[-1]
    b = min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)
    while blocks[b] <= 0.0:  # rounding put u on an empty block's edge: step back to mass
        b -= 1
    u -= cum[b] - blocks[b]
    inner = np.cumsum(p[b * _BLOCK:(b + 1) * _BLOCK], dtype=np.float64)
    return b * _BLOCK + min(int(np.searchsorted(inner, min(u, inner[-1] * (1 - 1e-12)), side="right")),
                            len(inner) - 1)


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


def verify(p: np.ndarray, q: np.ndarray | None, drafted: np.ndarray | list[int], rng: np.random.Generator,
           id_map: np.ndarray | None = None, draft_ids: np.ndarray | list[int] | None = None) -> tuple[int, int]:
    """The lossless speculative-sampling rule (Leviathan et al. / Chen et al.).

    * ``p`` ``[g + 1, V]``: target probabilities at each draft position and the bonus position.
    * ``q`` ``[g, K]``: drafter probabilities the drafts were sampled from, over the drafter's
      vocabulary (K = V unless trimmed); ``None`` for deterministic drafts (prompt lookup), i.e. q
      is one-hot on the drafted token.
    * ``drafted``: the g drafted tokens as target ids; ``draft_ids``: the same tokens as drafter
      ids (row indices into q) when ``id_map`` (drafter id -> target id) is given.

    Accept x with probability min(1, p(x)/q(x)); on the first rejection draw from
    norm(max(0, p - q)); after g accepts draw the bonus from p. A trimmed q is 0 outside the kept
    set, so the residual keeps all of p's mass there and the output is still distributed as p.
    Returns ``(accepted, next_token)``.
    """
    g = len(drafted)
    for i in range(g):
        x = int(drafted[i])
        px = float(p[i, x])
        if q is None:
            qx = 1.0
        else:
            qx = float(q[i, draft_ids[i] if id_map is not None else x])
        if rng.random() * qx < px:  # u < p/q, written without dividing
            continue
        residual = p[i].copy()
        if q is None:
            residual[x] = 0.0
        elif id_map is not None:
            residual[id_map] -= q[i]
        else:
            residual -= q[i]
        np.maximum(residual, 0.0, out=residual)
        if not residual.sum() > 0.0:  # p == q up to rounding: any draw from p is exact
            residual = p[i]
        return i, sample(residual, rng)
    return g, sample(p[g], rng)
