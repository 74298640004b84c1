"""The K-quant op library (kernels/kquant/) through ONNX Runtime, on random but valid Q4_K / Q6_K tensors.

GgufGather against gguf-py's dequantization bit for bit; GgufMatMul against float64 ``A @ W^T`` and against an
emulation of llama.cpp's Q8_K activation rounding; M rows == M x 1 row, 1 thread == 2 threads, interleave 0 vs 8;
bad attributes, bytes per row and ids give errors, not crashes; ``kernels.register``.

The library comes from ``edge_spec.kernels.kquant_library()`` (``EDGE_SPEC_KQUANT_LIB=/path`` for a build
of ``kernels/kquant/build.sh``). Without it the tests fail where pip builds it (Linux x86-64 with AVX2, FMA and
F16C: a missing build there is a defect) unless ``EDGE_SPEC_KQUANT_LIB=none`` asks for that, and skip elsewhere.
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from kquant_blocks import kernel_library
from onnx import TensorProto, helper

from edge_spec import kernels
from edge_spec.export.gguf_kquant import interleave8

Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 3, 6, 8, 12, 14
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210, Q5_0: 22, Q8_0: 34, Q4_1: 20}
BLOCK_VALUES = {Q4_K: 256, Q6_K: 256, Q5_0: 32, Q8_0: 32, Q4_1: 32}
QTYPE = {t: GGMLQuantizationType(t) for t in BLOCK_BYTES}
SHAPES = [(64, 512), (40, 768)]  # [N, K]; N = 40: not a multiple of 8, interleave 0 only
CASES = [(t, n, k, il) for t in (Q4_K, Q6_K) for n, k in SHAPES for il in (0, 8) if il == 0 or n % 8 == 0]


def _case_id(c: tuple) -> str:
    return f"{'q4k' if c[0] == Q4_K else 'q6k'}-{c[1]}x{c[2]}-il{c[3]}"


# ------------------------------------------------------------------------------------------------ the library
@pytest.fixture(scope="module")
def lib() -> str:
    return kernel_library()


# ------------------------------------------------------------------------------------------------ helpers
def make_tensor(rng: np.random.Generator, ggml_type: int, n: int, k: int) -> np.ndarray:
    """Random valid blocks [N, K / block values * block bytes]: random bytes, finite fp16 d (and dmin / m)."""
    nb = k // BLOCK_VALUES[ggml_type]
    b = rng.integers(0, 256, (n, nb, BLOCK_BYTES[ggml_type]), dtype=np.uint8)
    at = {Q4_K: slice(0, 4), Q4_1: slice(0, 4), Q6_K: slice(208, 210)}.get(ggml_type, slice(0, 2))  # Q4_K: d, dmin;
    # Q4_1: d, m; others: d
    d = (rng.uniform(1e-4, 2e-2, (n, nb, (at.stop - at.start) // 2)) * rng.choice([-1, 1], (n, nb, 1)))
    b[..., at] = d.astype(np.float16).view(np.uint8)
    return b.reshape(n, -1)


def stored(w: np.ndarray, ggml_type: int, interleave: int) -> np.ndarray:
    return interleave8(w, ggml_type) if interleave == 8 else w


def model(op: str, ggml_type: int, interleave: int | None = 0) -> bytes:
    """One node: GgufMatMul(A, B) -> Y or GgufGather(B, ids) -> Y, every input a graph input."""
    b = helper.make_tensor_value_info("B", TensorProto.UINT8, ["N", "R"])
    if op == "GgufMatMul":
        inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, None), b]
    else:
        inputs = [b, helper.make_tensor_value_info("ids", TensorProto.INT64, None)]
    attrs = {"ggml_type": ggml_type} if interleave is None else {"ggml_type": ggml_type, "interleave": interleave}
    node = helper.make_node(op, [i.name for i in inputs], ["Y"], domain="edge_spec", **attrs)
    graph = helper.make_graph([node], "kquant", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("edge_spec", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def session(lib: str, model_bytes: bytes, threads: int = 1,
            so: ort.SessionOptions | None = None) -> ort.InferenceSession:
    if so is None:
        so = ort.SessionOptions()
        so.register_custom_ops_library(lib)
    so.intra_op_num_threads = threads
    so.log_severity_level = 4  # the expected errors below are raised, not logged
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def matmul(sess: ort.InferenceSession, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a [M, K] -> y [M, N], through the graph's [1, M, K] input."""
    return sess.run(None, {"A": a[None].astype(np.float32), "B": w})[0][0]


def q8k(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` [M, K] as llama.cpp's quantize_row_q8_K rounds them (fp32, per 256: iscale = -127 / the first
    value of largest magnitude, codes nearest-even, at most 127, d = 1 / iscale), returned as float64 d * q."""
    x = a.astype(np.float32).reshape(len(a), -1, 256)
    ax = np.abs(x)
    first = np.argmax(ax == ax.max(axis=-1, keepdims=True), axis=-1)[..., None]
    mx = np.take_along_axis(x, first, axis=-1)  # nonzero for Gaussian rows
    iscale = np.float32(-127.0) / mx
    q = np.minimum(127, np.rint(iscale * x))
    d = np.float32(1.0) / iscale
    assert iscale.dtype == q.dtype == d.dtype == np.float32
    return (d.astype(np.float64) * q).reshape(a.shape)


def rel_rms(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y.astype(np.float64) - ref) ** 2) / np.mean(ref ** 2)))


# ------------------------------------------------------------------------------------------------ GgufGather
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gather_equals_gguf_py_bit_for_bit(lib: str, case: tuple) -> None:
    ggml_type, n, k, il = case
    rng = np.random.default_rng(n + k + ggml_type)
    w = make_tensor(rng, ggml_type, n, k)
    ref = np.asarray(dequantize(w, QTYPE[ggml_type]), dtype=np.float32)  # [N, K]
    assert ref.shape == (n, k) and np.isfinite(ref).all()
    ids = np.concatenate([rng.integers(0, n, 17), [0, n - 1, 5, 5, 5, n - 1]]).astype(np.int64)[None]  # [1, S]
    sess = session(lib, model("GgufGather", ggml_type, il))
    y = sess.run(None, {"B": stored(w, ggml_type, il), "ids": ids})[0]
    assert y.shape == (1, ids.shape[1], k) and y.dtype == np.float32
    np.testing.assert_array_equal(y.view(np.uint32), ref[ids].view(np.uint32))  # bits, signs of zeros included
    every = np.arange(n, dtype=np.int64).reshape(2, -1)  # every row, ids of another shape
    y = sess.run(None, {"B": stored(w, ggml_type, il), "ids": every})[0]
    np.testing.assert_array_equal(y.view(np.uint32), ref[every].view(np.uint32))


@pytest.mark.parametrize("il", [0, 8])
def test_gather_bad_id_is_an_error(lib: str, il: int) -> None:
    n, k = 64, 256
    w = stored(make_tensor(np.random.default_rng(1), Q4_K, n, k), Q4_K, il)
    sess = session(lib, model("GgufGather", Q4_K, il))
    for bad in (n, -1, 1 << 40):
        with pytest.raises(Exception, match=rf"id {bad} .*N = {n}\b"):
            sess.run(None, {"B": w, "ids": np.array([[3, bad, 4]], dtype=np.int64)})
    assert sess.run(None, {"B": w, "ids": np.array([[n - 1]], dtype=np.int64)})[0].shape == (1, 1, k)  # still fine


# ------------------------------------------------------------------------------------------------ GgufMatMul
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matmul_accuracy(lib: str, case: tuple) -> None:
    ggml_type, n, k, il = case
    rng = np.random.default_rng(7 * n + k + ggml_type)
    w = make_tensor(rng, ggml_type, n, k)
    wf = np.asarray(dequantize(w, QTYPE[ggml_type]), dtype=np.float64)
    a = rng.standard_normal((5, k)).astype(np.float32)
    y = matmul(session(lib, model("GgufMatMul", ggml_type, il)), a, stored(w, ggml_type, il))
    assert y.shape == (5, n) and y.dtype == np.float32
    assert rel_rms(y, a.astype(np.float64) @ wf.T) < 2e-2  # int8 activations: 6e-3 .. 8e-3 measured
    assert rel_rms(y, q8k(a) @ wf.T) < 1e-5  # llama.cpp's arithmetic in exact math: 4e-8 .. 1.5e-7 measured


@pytest.mark.parametrize("case", [c for c in CASES if c[1] == 64] + [(Q4_K, 40, 768, 0)], ids=_case_id)
def test_matmul_rows_and_threads_bit_for_bit(lib: str, case: tuple) -> None:
    ggml_type, n, k, il = case
    rng = np.random.default_rng(3)
    w = stored(make_tensor(rng, ggml_type, n, k), ggml_type, il)
    one, two = (session(lib, model("GgufMatMul", ggml_type, il), threads=t) for t in (1, 2))
    a = rng.standard_normal((9, k)).astype(np.float32)
    rows = np.concatenate([matmul(one, a[r:r + 1], w) for r in range(9)])
    for m in (1, 2, 3, 4, 5, 9):
        np.testing.assert_array_equal(matmul(one, a[:m], w).view(np.uint32), rows[:m].view(np.uint32))
        np.testing.assert_array_equal(matmul(two, a[:m], w).view(np.uint32), rows[:m].view(np.uint32))


_ISA_RUN = """
import sys, numpy as np, onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from test_kquant_op import model, session, matmul, make_tensor, stored
from edge_spec import kernels
out = {"isa": np.array(kernels.kquant_isa())}
for t in (12, 14, 8, 6, 3):
    for n in (64, 24):  # 24: an odd number of groups of 8 (the last pair is half)
        rng = np.random.default_rng(5)
        w = stored(make_tensor(rng, t, n, 1536), t, 8)
        a = rng.standard_normal((17, 1536)).astype(np.float32)
        sess = session(sys.argv[2], model("GgufMatMul", t, 8))
        out[f"{t}-{n}"] = np.concatenate([matmul(sess, a[:m], w) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17)], axis=0)
np.savez(sys.argv[3], **out)
"""


def test_matmul_avx512_vnni_and_amx_equal_avx2_bit_for_bit(lib: str, tmp_path) -> None:
    """Where the CPU has AVX-512 VNNI the interleaved kernels run kquant_vnni.cpp (and kquant_q32_vnni.cpp for
    Q8_0 / Q5_0 / Q4_1), and where it has AMX too, kquant_amx.cpp for the K-quant passes of several rows: the same
    numbers as the AVX2 kernels (EDGE_SPEC_KQUANT_ISA=avx2), bit for bit, at every row count (17: a pass of more rows
    than a tile holds). The ISA is chosen once per process; without the variable it is the best the CPU has."""
    import subprocess
    import sys

    flags = kernels._cpu_flags() or set()
    if not {"avx512vl", "avx512_vnni"} <= flags:
        pytest.skip("this CPU has no AVX-512 VNNI: only the AVX2 kernels run here")
    isas = ["avx2", "avx512vnni"] + (["amx"] if {"amx_tile", "amx_int8"} <= flags else [])
    here = os.path.dirname(__file__)
    runs = {}
    for isa in isas:
        env = {**os.environ, "EDGE_SPEC_KQUANT_ISA": isa}
        if isa == "amx":  # the default where the CPU (and the kernel) allow the tiles
            env.pop("EDGE_SPEC_KQUANT_ISA")
        subprocess.run([sys.executable, "-c", _ISA_RUN, here, lib, str(tmp_path / f"{isa}.npz")], env=env,
                       check=True)
        runs[isa] = np.load(tmp_path / f"{isa}.npz")
        assert str(runs[isa]["isa"]) == isa  # the library says which kernels it ran
    for isa in isas[1:]:
        for key in runs["avx2"].files:
            if key != "isa":
                np.testing.assert_array_equal(runs["avx2"][key].view(np.uint32), runs[isa][key].view(np.uint32),
                                              err_msg=f"{isa} against avx2, {key}")


@pytest.mark.parametrize("ggml_type", [Q4_K, Q6_K])
def test_matmul_interleave_0_vs_8(lib: str, ggml_type: int) -> None:
    """The same numbers up to the fp32 summation order (the row kernels sum per-lane partial sums, the x8 kernels
    whole super-blocks); the attribute's default is 0."""
    n, k = 64, 1024
    rng = np.random.default_rng(11)
    w = make_tensor(rng, ggml_type, n, k)
    a = rng.standard_normal((5, k)).astype(np.float32)
    y0 = matmul(session(lib, model("GgufMatMul", ggml_type, 0)), a, w)
    y8 = matmul(session(lib, model("GgufMatMul", ggml_type, 8)), a, interleave8(w, ggml_type))
    yd = matmul(session(lib, model("GgufMatMul", ggml_type, None)), a, w)
    np.testing.assert_array_equal(yd.view(np.uint32), y0.view(np.uint32))
    scale = float(np.sqrt(np.mean(y0.astype(np.float64) ** 2)))
    diff = np.abs(y0.astype(np.float64) - y8)
    assert rel_rms(y8, y0.astype(np.float64)) < 5e-7  # measured 8e-8 (Q4_K), 1.4e-7 (Q6_K)
    assert diff.max() / scale < 2e-6  # measured 2.8e-7, 5.2e-7 (K = 4096: up to 8.4e-7)
    assert not np.array_equal(y0, y8)  # they do differ (if this fails, the kernels now agree: tighten the above)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("op", ["GgufMatMul", "GgufGather"])
@pytest.mark.parametrize(("ggml_type", "il", "message"), [(2, 0, "ggml_type 2"), (Q4_K, 4, "interleave 4"),
                                                           (Q6_K, 4, "interleave 4")])
def test_bad_attributes_are_errors(lib: str, op: str, ggml_type: int, il: int, message: str) -> None:
    w = make_tensor(np.random.default_rng(0), Q4_K, 8, 256)
    with pytest.raises(Exception, match=message):  # on session creation (kernel creation), else on the run
        sess = session(lib, model(op, ggml_type, il))
        feeds = {"A": np.ones((1, 1, 256), np.float32)} if op == "GgufMatMul" else {"ids": np.zeros((1, 1), np.int64)}
        sess.run(None, {"B": w, **feeds})


@pytest.mark.parametrize("ggml_type", [Q4_K, Q6_K])
def test_bad_bytes_per_row_are_errors(lib: str, ggml_type: int) -> None:
    bb = BLOCK_BYTES[ggml_type]
    mm, ga = session(lib, model("GgufMatMul", ggml_type, 0)), session(lib, model("GgufGather", ggml_type, 0))
    a, ids = np.ones((1, 2, 512), np.float32), np.zeros((1, 2), np.int64)
    for row_bytes in (2 * bb - 1, 2 * bb + 1, bb):  # bb: a valid row of K = 256, but A has K = 512
        w = np.zeros((8, row_bytes), np.uint8)
        with pytest.raises(Exception, match=f"B has {row_bytes} bytes per row"):
            mm.run(None, {"A": a, "B": w})
        if row_bytes != bb:
            with pytest.raises(Exception, match=f"B has {row_bytes} bytes per row"):
                ga.run(None, {"B": w, "ids": ids})
    for op, feeds in (("GgufMatMul", {"A": a}), ("GgufGather", {"ids": ids})):  # interleave 8 needs N % 8 == 0
        with pytest.raises(Exception, match="multiple of 8, not 12"):
            session(lib, model(op, ggml_type, 8)).run(None, {"B": np.zeros((12, 2 * bb), np.uint8), **feeds})
    w = make_tensor(np.random.default_rng(0), ggml_type, 8, 512)
    assert mm.run(None, {"A": a, "B": w})[0].shape == (1, 2, 8)  # the sessions still work


# ------------------------------------------------------------------------------------------------ registering
def test_register_kquant(lib: str) -> None:
    so = ort.SessionOptions()
    kernels.register(so, ["edge_spec.kquant"])
    w = make_tensor(np.random.default_rng(5), Q6_K, 8, 256)
    sess = session(lib, model("GgufGather", Q6_K, 0), so=so)
    y = sess.run(None, {"B": w, "ids": np.array([[7, 0]], np.int64)})[0]
    np.testing.assert_array_equal(y[0], np.asarray(dequantize(w, QTYPE[Q6_K]), np.float32)[[7, 0]])


def test_register_unknown_library_raises() -> None:
    with pytest.raises(RuntimeError, match="other"):
        kernels.register(ort.SessionOptions(), ["other"])
