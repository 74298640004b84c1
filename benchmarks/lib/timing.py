"""Timing helpers shared by the benchmarks: the cost of one decode step at a given context length."""

from __future__ import annotations

import statistics
import time
from typing import Any


def step_times(engines: dict[str, Any], ctx: int, repeats: int) -> dict[str, dict[str, float]]:
    """Min and median ms of a 1-token target step at ``ctx`` cached positions, for each loaded ``Engine``, the
    engines interleaved step by step (3 warm-up steps each)."""
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for i in range(repeats + 3):
        for name, e in engines.items():
            t = e.target
            t.rewind_to(0)
            t.kv.length = ctx - 1  # positions [0, ctx - 1) hold (zero) keys: the cost does not depend on values
            t0 = time.perf_counter()
            t.forward([42])
            if i >= 3:
                samples[name].append(time.perf_counter() - t0)
            t.rewind_to(0)
    return {k: {"min_ms": round(min(v) * 1e3, 3), "median_ms": round(statistics.median(v) * 1e3, 3)}
            for k, v in samples.items()}
