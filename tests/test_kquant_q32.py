"""GgufMatMul on Q8_0, Q5_0 and Q4_1 (ggml's blocks of 32; kernels/kquant/kquant_q32*.cpp), rows interleaved by 8.

Against float64 ``A @ W^T`` of gguf-py's dequantization, and against the kernels' arithmetic in exact math
(activations rounded to int8 per 32: codes round(x * 127 / max |x|) to nearest even, d = 1 / (127 / max |x|));
M rows == M x 1 row at 1 and 2 threads; what the kernels refuse (the file's row order, a lookup, K not a multiple
of 32) is an error naming it. AVX2 against AVX-512 VNNI: tests/test_kquant_op.py. The library fixture and the
one-node graphs are test_kquant_op.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize
from test_kquant_op import Q4_1, Q5_0, Q8_0, QTYPE, lib, make_tensor, matmul, model, rel_rms, session  # noqa: F401

from edge_spec.export.gguf_kquant import interleave8, supports

SHAPES = [(64, 896), (128, 4864), (24, 96), (192, 576)]  # [N, K]: the 0.5B coder drafter's widths; an odd group
# count; SmolLM2-135M's k / v projections (a Q4_1 file)
CASES = [(t, n, k) for t in (Q8_0, Q5_0, Q4_1) for n, k in SHAPES]
NAMES = {Q8_0: "q8_0", Q5_0: "q5_0", Q4_1: "q4_1"}


def _id(c: tuple) -> str:
    return f"{NAMES[c[0]]}-{c[1]}x{c[2]}"


def q32(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` [M, K] rounded as the kernels round them, returned as float64 d * q."""
    x = a.astype(np.float32).reshape(len(a), -1, 32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    iscale = np.float32(127.0) / amax
    q = np.clip(np.rint(iscale * x), -127, 127)
    d = np.float32(1.0) / iscale
    assert iscale.dtype == q.dtype == d.dtype == np.float32
    return (d.astype(np.float64) * q).reshape(a.shape)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_matmul_accuracy(lib: str, case: tuple) -> None:  # noqa: F811
    t, n, k = case
    rng = np.random.default_rng(n + k + t)
    w = make_tensor(rng, t, n, k)
    wf = np.asarray(dequantize(w, QTYPE[t]), dtype=np.float64)
    a = rng.standard_normal((5, k)).astype(np.float32)
    y = matmul(session(lib, model("GgufMatMul", t, 8)), a, interleave8(w, t))
    assert y.shape == (5, n) and y.dtype == np.float32
    assert rel_rms(y, a.astype(np.float64) @ wf.T) < 1.5e-2  # int8 activations per 32: 5e-3 .. 6e-3 measured
    assert rel_rms(y, q32(a) @ wf.T) < 1e-5  # the same arithmetic in exact math


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_matmul_rows_and_threads_bit_for_bit(lib: str, case: tuple) -> None:  # noqa: F811
    t, n, k = case
    rng = np.random.default_rng(3)
    w = interleave8(make_tensor(rng, t, n, k), t)
    one, two = (session(lib, model("GgufMatMul", t, 8), threads=th) for th in (1, 2))
    a = rng.standard_normal((9, k)).astype(np.float32)
    a[2, :32] = 0.0  # an all-zero activation block
    rows = np.concatenate([matmul(one, a[r:r + 1], w) for r in range(9)])
    for m in (1, 2, 3, 4, 5, 9):
        np.testing.assert_array_equal(matmul(one, a[:m], w).view(np.uint32), rows[:m].view(np.uint32))
        np.testing.assert_array_equal(matmul(two, a[:m], w).view(np.uint32), rows[:m].view(np.uint32))


@pytest.mark.parametrize("t", [Q8_0, Q5_0, Q4_1])
def test_what_the_kernels_refuse_is_an_error(lib: str, t: int) -> None:  # noqa: F811
    w = make_tensor(np.random.default_rng(0), t, 8, 64)
    with pytest.raises(Exception, match="interleaved by 8 only"):  # the file's row order
        session(lib, model("GgufMatMul", t, 0)).run(None, {"A": np.ones((1, 1, 64), np.float32), "B": w})
    with pytest.raises(Exception, match=f"ggml_type {t} is not supported"):  # an embedding lookup
        session(lib, model("GgufGather", t, 8)).run(None, {"B": w, "ids": np.zeros((1, 1), np.int64)})
    with pytest.raises(Exception, match="not a multiple of 32"):
        session(lib, model("GgufMatMul", t, 8)).run(None, {"A": np.ones((1, 1, 48), np.float32),
                                                            "B": np.zeros((8, 51), np.uint8)})


def test_export_takes_them_for_layer_weights_only() -> None:
    assert supports("Q8_0", 896) and supports("Q5_0", 128) and supports("Q4_1", 576)
    assert not supports("Q8_0", 1598)  # N not a multiple of 8
    assert not supports("Q5_0", None) and not supports("Q4_1", None)  # an embedding or an LM head (VocabTrim)
    assert supports("Q4_K", None) and supports("Q6_K", 1598) and not supports("Q4_0", 896)
