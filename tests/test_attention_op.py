"""edge_spec::CacheAttention / CacheAttentionF32 (kernels/kquant/attention.cpp) through ONNX Runtime.

Against a float64 numpy reference of causal grouped-query attention with rotary embedding (the cache's rounding
included) and against com.microsoft::GroupQueryAttention on the same inputs; a k-row pass equals k one-row passes
bit for bit (what lets a graph drop the padding row), at 1 and 2 threads; the cache is written in place when
present is bound to past's buffer; packed and separate q/k/v, sliding window, softcap; bad shapes give errors.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kquant_blocks import kernel_library
from onnx import TensorProto, helper

H, HK, D, CAP, POS = 6, 2, 32, 40, 48  # heads, kv heads, head size, cache capacity, rotary table rows


@pytest.fixture(scope="module")
def lib() -> str:
    return kernel_library()


def _graph(op: str, half: bool, packed: bool = True, window: int = -1, softcap: float = 0.0, rot: int = D // 2,
           heads: int = H) -> bytes:
    """One attention node: inputs q(kv) [1, S, ...], past k/v [1, HK, CAP, D], seqlens_k, total, cos/sin."""
    f, kv = TensorProto.FLOAT, TensorProto.FLOAT16 if half else TensorProto.FLOAT
    width = (heads + 2 * HK) * D if packed else heads * D
    ins = [helper.make_tensor_value_info("q", f, [1, "S", width])]
    if not packed:
        ins += [helper.make_tensor_value_info(n, f, [1, "S", HK * D]) for n in ("k", "v")]
    ins += [helper.make_tensor_value_info(n, kv, [1, HK, CAP, D]) for n in ("pk", "pv")]
    ins += [helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("cos", f, [POS, rot]), helper.make_tensor_value_info("sin", f, [POS, rot])]
    outs = [helper.make_tensor_value_info("out", f, [1, "S", heads * D]),
            helper.make_tensor_value_info("k_out", kv, [1, HK, CAP, D]),
            helper.make_tensor_value_info("v_out", kv, [1, HK, CAP, D])]
    names = ["q", "" if packed else "k", "" if packed else "v", "pk", "pv", "seqlens", "total", "cos", "sin"]
    attrs = dict(num_heads=heads, kv_num_heads=HK, scale=float(1 / np.sqrt(D)), local_window_size=window,
                 softcap=float(softcap))
    if op == "GroupQueryAttention":
        attrs.update(do_rotary=1, rotary_interleaved=0)
        domain = "com.microsoft"
    else:
        domain = "edge_spec"
    node = helper.make_node(op, names, ["out", "k_out", "v_out"], domain=domain, **attrs)
    model = helper.make_model(helper.make_graph([node], "attn", ins, outs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    model.ir_version = 8
    return model.SerializeToString()


def _session(lib: str, model: bytes, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(lib)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _tables(rot: int = D // 2) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (10000 ** (np.arange(rot) / rot))
    ang = np.arange(POS)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = cos.shape[-1]
    a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)


def _reference(q, k, v, kc, vc, past, window=-1, softcap=0.0, rot=D // 2, write=True):
    """float64 attention of rows past..past+S-1, q [S, H, D], k / v [S, HK, D]; caches [HK, CAP, D] holding the
    past (and, ``write=False``, the pass's rows as the op stored them). Returns (out [S, H * D], caches)."""
    cos, sin = (t.astype(np.float64) for t in _tables(rot))
    kc, vc = kc.astype(np.float64), vc.astype(np.float64)
    S, heads = q.shape[0], q.shape[1]
    for r in range(S if write else 0):
        p = past + r
        kc[:, p] = _rotate(k[r].astype(np.float64), cos[p], sin[p])
        vc[:, p] = v[r]
    out = np.zeros((S, heads, D))
    for r in range(S):
        p = past + r
        lo = 0 if window <= 0 else max(0, p + 1 - window)
        for h in range(heads):
            g = h // (heads // HK)
            qh = _rotate(q[r, h].astype(np.float64), cos[p], sin[p])
            s = kc[g, lo:p + 1] @ qh / np.sqrt(D)
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max())
            out[r, h] = (w / w.sum()) @ vc[g, lo:p + 1]
    return out.reshape(S, heads * D), kc, vc


def _inputs(rng, S, half, past, packed=True, rot=D // 2):
    dt = np.float16 if half else np.float32
    q = rng.standard_normal((1, S, H * D)).astype(np.float32)
    k = rng.standard_normal((1, S, HK * D)).astype(np.float32)
    v = rng.standard_normal((1, S, HK * D)).astype(np.float32)
    pk = np.zeros((1, HK, CAP, D), dt)
    pv = np.zeros((1, HK, CAP, D), dt)
    pk[:, :, :past] = rng.standard_normal((1, HK, past, D))
    pv[:, :, :past] = rng.standard_normal((1, HK, past, D))
    cos, sin = _tables(rot)
    feeds = {"pk": pk, "pv": pv, "seqlens": np.array([past + S - 1], np.int32),
             "total": np.array([past + S], np.int32), "cos": cos, "sin": sin}
    if packed:
        feeds["q"] = np.concatenate([q, k, v], axis=-1)
    else:
        feeds.update(q=q, k=k, v=v)
    return feeds, q, k, v


@pytest.mark.parametrize("half", [True, False], ids=["fp16-kv", "fp32-kv"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("window,softcap,rot", [(-1, 0.0, D // 2), (7, 2.5, D // 4)], ids=["full", "window-cap"])
def test_matches_reference(lib: str, half: bool, packed: bool, window: int, softcap: float, rot: int) -> None:
    rng = np.random.default_rng(1)
    op = "CacheAttention" if half else "CacheAttentionF32"
    sess = _session(lib, _graph(op, half, packed, window=window, softcap=softcap, rot=rot))
    for S, past in ((1, 0), (1, 17), (5, 9), (3, 30)):
        feeds, q, k, v = _inputs(rng, S, half, past, packed, rot=rot)
        out, kc, vc = sess.run(None, feeds)
        qs, ks, vs = q[0].reshape(S, H, D), k[0].reshape(S, HK, D), v[0].reshape(S, HK, D)
        _, want_k, want_v = _reference(qs, ks, vs, feeds["pk"][0], feeds["pv"][0], past, window, softcap, rot)
        tol = 2e-3 if half else 1e-5  # the pass's rows as stored: rotated k and v, rounded to the cache's type
        new = slice(past, past + S)
        np.testing.assert_allclose(kc[0][:, new].astype(np.float64), want_k[:, new], atol=tol, rtol=tol)
        np.testing.assert_allclose(vc[0][:, new].astype(np.float64), want_v[:, new], atol=tol, rtol=tol)
        assert np.array_equal(kc[0][:, :past], feeds["pk"][0][:, :past])  # the past is kept
        ref, _, _ = _reference(qs, ks, vs, kc[0], vc[0], past, window, softcap, rot, write=False)  # cache as stored
        np.testing.assert_allclose(out[0], ref, atol=2e-5, rtol=1e-4)


def test_close_to_group_query_attention(lib: str) -> None:
    """The same node as ONNX Runtime's GroupQueryAttention (fp16 KV, both given fp32 q/k/v: GQA casts nothing)."""
    rng = np.random.default_rng(2)
    ours = _session(lib, _graph("CacheAttentionF32", False))
    gqa = _session(lib, _graph("GroupQueryAttention", False))
    for S, past in ((1, 0), (1, 30), (4, 11)):
        feeds, *_ = _inputs(rng, S, False, past)
        a, b = ours.run(None, feeds), gqa.run(None, feeds)
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("window,softcap", [(-1, 0.0), (7, 0.0), (-1, 2.5)])
def test_rows_are_independent_of_the_pass(lib: str, window: int, softcap: float) -> None:
    """A k-row pass == k one-row passes bit for bit, 1 thread == 2 threads; the cache written in place."""
    rng = np.random.default_rng(3)
    model = _graph("CacheAttention", True, window=window, softcap=softcap, rot=D // 4)
    s1, s2 = _session(lib, model, 1), _session(lib, model, 2)
    S, past = 6, 13
    feeds, *_ = _inputs(rng, S, True, past, rot=D // 4)
    full, kc, vc = s2.run(None, feeds)
    pk, pv = feeds["pk"].copy(), feeds["pv"].copy()
    for r in range(S):  # one row at a time, in place through an IOBinding (present bound to past's buffer)
        io = s1.io_binding()
        one = {**feeds, "q": np.ascontiguousarray(feeds["q"][:, r:r + 1]),
               "seqlens": np.array([past + r], np.int32), "total": np.array([past + r + 1], np.int32)}
        for name in ("q", "seqlens", "total", "cos", "sin"):
            io.bind_cpu_input(name, one[name])
        kv = [ort.OrtValue.ortvalue_from_numpy(pk), ort.OrtValue.ortvalue_from_numpy(pv)]
        io.bind_ortvalue_input("pk", kv[0])
        io.bind_ortvalue_input("pv", kv[1])
        io.bind_ortvalue_output("k_out", kv[0])
        io.bind_ortvalue_output("v_out", kv[1])
        out = np.zeros((1, 1, H * D), np.float32)
        io.bind_output("out", "cpu", 0, np.float32, out.shape, out.ctypes.data)
        s1.run_with_iobinding(io)
        assert np.array_equal(out[0, 0], full[0, r]), f"row {r} differs from the {S}-row pass"
    assert np.array_equal(pk, kc) and np.array_equal(pv, vc)


def test_a_plain_loop_grows_present(lib: str) -> None:
    """Fed exactly the past (no spare capacity, as plain ONNX Runtime loops do), present grows by the pass's rows and
    the outputs are the in-place run's bit for bit."""
    rng = np.random.default_rng(5)
    m = onnx.load_from_string(_graph("CacheAttention", True))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.name in ("pk", "pv", "k_out", "v_out"):
            vi.type.tensor_type.shape.dim[2].dim_param = "T"
    sess = _session(lib, m.SerializeToString())
    S, past = 4, 9
    feeds, *_ = _inputs(rng, S, True, past)
    ref, kc, vc = sess.run(None, feeds)  # capacity CAP, in a fresh present (not bound to past)
    short = {**feeds, "pk": np.ascontiguousarray(feeds["pk"][:, :, :past]),
             "pv": np.ascontiguousarray(feeds["pv"][:, :, :past])}
    out, k2, v2 = sess.run(None, short)
    assert k2.shape == (1, HK, past + S, D) and np.array_equal(out, ref)
    assert np.array_equal(k2, kc[:, :, :past + S]) and np.array_equal(v2, vc[:, :, :past + S])


def test_bad_shapes_are_errors(lib: str) -> None:
    rng = np.random.default_rng(4)
    sess = _session(lib, _graph("CacheAttention", True))
    feeds, *_ = _inputs(rng, 3, True, CAP - 2)
    feeds["seqlens"] = np.array([CAP + 2], np.int32)  # 40 past + 3 rows: beyond a cache of 40 (total says 41)
    feeds["total"] = np.array([CAP + 1], np.int32)
    with pytest.raises(Exception, match="the cache holds 41"):
        sess.run(None, feeds)
    with pytest.raises(Exception, match="must be a positive multiple of kv_num_heads"):
        _session(lib, _graph("CacheAttention", True, heads=5))
