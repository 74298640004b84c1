"""Log-probabilities of committed tokens, read from the target logits the verify pass already computed.

Which distribution: the one the token was drawn from. Sampled (temperature T > 0), that is :func:`probs`
of the logits — temperature, then top-k, top-p and min-p, renormalised — so a token the filters removed
has probability 0 and never appears among the alternatives. Greedy (T = 0) has no distribution of its own
(it is a point mass); there, as llama-server and OpenAI do, the values are the target's plain softmax at
T = 1 with no filter, so the chosen token is always the first alternative.

Cost: nothing unless asked for. When asked, one pass over the vocabulary per committed token (a
log-sum-exp, or :func:`probs` when sampling), on rows the verify pass produced anyway: the same rows in
speculative and plain decoding, so the values are equal wherever the tokens are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge_spec.runtime.sampling import SamplingConfig, probs

MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI allows


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token: its natural-log probability and the ``top`` likeliest tokens at its position
    (token id, log-probability), likeliest first, ties by lower id (so at T = 0 the first is the token itself)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_distribution(row: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """``row`` [V] target logits -> [V] float64 log-probabilities of the distribution described in the module
    docstring (-inf where a filter removed the token)."""
    x = row.astype(np.float64)
    if cfg.greedy:
        x -= x.max()
        x -= np.log(np.exp(x).sum())
        return x
    p = probs(x[None], cfg)[0]  # float64: temperature, top-k, top-p, min-p
    with np.errstate(divide="ignore"):
        return np.log(p)


def top_tokens(lp: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The ``n`` likeliest tokens of ``lp`` [V] with finite log-probability, likeliest first, ties by lower id."""
    if n <= 0:
        return ()
    finite = np.isfinite(lp)
    m = min(n, int(finite.sum()))
    if m == 0:
        return ()
    kth = np.partition(np.where(finite, lp, -np.inf), len(lp) - m)[len(lp) - m]
    idx = np.flatnonzero(lp >= kth)  # every token tied with the m-th is a candidate: ties go to the lower id
    order = np.lexsort((idx, -lp[idx]))[:m]
    return tuple((int(idx[i]), float(lp[idx[i]])) for i in order)


def token_logprobs(logits: np.ndarray, tokens: Sequence[int], cfg: SamplingConfig, top: int) -> list[TokenLogprob]:
    """``logits`` [>= len(tokens), V]: row i is the target's logits at the position of ``tokens[i]``. Returns one
    :class:`TokenLogprob` per token with its ``top`` likeliest alternatives (0..:data:`MAX_TOP_LOGPROBS`)."""
    out = []
    for i, t in enumerate(tokens):
        lp = log_distribution(logits[i], cfg)
        out.append(TokenLogprob(int(t), float(lp[int(t)]), top_tokens(lp, top)))
    return out
