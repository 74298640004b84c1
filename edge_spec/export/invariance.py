"""Is the target graph batch-invariant? Measured at export, bit for bit, through the runtime's own session.

Speculative decoding is lossless only if the target's k-token verify pass computes each row
exactly as the 1-token step of plain decoding would. On ONNX Runtime's CPU kernels that holds
for passes of two or more rows (GroupQueryAttention uses MLAS's M=1 GEMM kernel for a single
query row and its general kernel otherwise; MatMulNBits with int8 activations is row-invariant),
so the runtime pads 1-token target passes to 2 rows. This module measures, on the exported graph,
the smallest pass size from which every row is bit-identical whatever the pass size, so the
manifest states it rather than assumes it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from edge_spec.bundle import ModelSpec

PASS_SIZES = (1, 2, 3, 5, 9)  # verify passes the loop runs: gamma + 1 for gamma up to 8


def batch_invariant_rows(graph: Path, spec: ModelSpec, *, prompt: int = 11, seed: int = 0) -> int | None:
    """Smallest ``r`` in (1, 2) such that every pass of >= r rows (padded up to r) gives each row
    the same logits bit for bit as any other pass; ``None`` when neither holds.

    Runs random in-vocabulary tokens: a ``prompt``-token prefill, then the same 9 continuation
    tokens fed in passes of each size in PASS_SIZES, and compares all rows with the 2-row-padded
    single steps (and the true 1-row steps for r = 1).
    """
    from edge_spec.runtime.session import ModelSession

    rng = np.random.default_rng(seed)
    n_new = max(PASS_SIZES)
    ids = rng.integers(3, spec.vocab_size, size=prompt + n_new)
    spec = replace(spec, max_context=prompt + n_new + 4)

    def run(min_rows: int, size: int) -> np.ndarray:
        sess = ModelSession(graph, spec, providers=["CPUExecutionProvider"], device="cpu",
                            capacity=prompt + n_new + 2, max_rows=max(prompt, size), min_rows=min_rows)
        sess.forward(ids[:prompt])
        out = []
        for s in range(prompt, prompt + n_new, size):
            out.append(np.array(sess.forward(ids[s:min(s + size, prompt + n_new)]), dtype=np.float32))
        return np.concatenate(out)

    for min_rows in (1, 2):
        ref = run(min_rows, 1)
        if all(np.array_equal(ref, run(min_rows, size)) for size in PASS_SIZES if size > 1):
            return min_rows
    return None
