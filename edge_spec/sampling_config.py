"""How logits become a distribution, as settings: temperature, top-k, top-p, min-p (:class:`SamplingConfig`).

Below both the runtime, which samples with it (runtime/sampling.py), and the bundle, whose manifest may recommend
one (the ``sampling`` block, checked when it is read)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edge_spec.errors import EdgeSpecError


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution. Numbers only: a string or NaN is refused with one sentence."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off; else drop tokens below min_p x the likeliest token's probability

    def __post_init__(self) -> None:
        t, k, tp, mp = self.temperature, self.top_k, self.top_p, self.min_p
        if not _is_number(mp) or not 0.0 <= mp < 1.0:
            raise EdgeSpecError(f"min_p={mp!r} must be a number in [0, 1) (0 turns it off).")
        if not _is_number(t) or not 0 <= t < math.inf:
            raise EdgeSpecError(f"temperature={t!r} must be a finite number >= 0 (0 means greedy).")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise EdgeSpecError(f"top_k={k!r} must be a whole number >= 0 (0 turns it off).")
        if not _is_number(tp) or not 0.0 < tp <= 1.0:
            raise EdgeSpecError(f"top_p={tp!r} must be a number in (0, 1] (1 turns it off).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
