"""One layer's decode attention: ONNX Runtime's GroupQueryAttention vs the same attention in standard ops.

    python benchmarks/attention_ops.py [--threads 1 2] [--contexts 150 1024 2048 4000] [--rows 1 4]

SmolLM2-135M's shapes (9 query heads, 3 KV heads of 64, an fp16 cache of 4,096 positions bound as both past and
present, as the runtime binds it). Three single-layer graphs, timed interleaved (median of 55 runs each):

* ``gqa``: what the exporter writes (q/k/v cast to fp16, GroupQueryAttention with rotary, output cast back).
  Its CPU kernel loops over the 9 query heads and, for each, converts its KV head's whole past to fp32.
* ``ops``: rotary (com.microsoft RotaryEmbedding), the new rows written into the cache in place (ScatterND whose
  output is bound to its input buffer), the valid prefix sliced and cast to fp32 once per KV head, the three
  query heads of a group as rows of one FusedMatMul (transB), an additive causal mask, Softmax, MatMul.
* ``ops16``: the same with the two matmuls in fp16 (no cast of the cache).

First it checks that the ops graphs write the same cache rows for V (K differs in rounding: rotary in fp32
rather than fp16) and leave the past untouched, and how far their outputs are from GroupQueryAttention's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper, numpy_helper

H, KV, D, CAP = 9, 3, 64, 4096  # query heads, KV heads, head size, cache positions
G = H // KV
F16, F32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT64


def _rope() -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [CAP, D / 2] float32 (SmolLM2's base 100,000)."""
    inv = 1.0 / (100000.0 ** (np.arange(0, D, 2) / D))
    f = np.outer(np.arange(CAP), inv)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def _io() -> tuple[list, list]:
    vi = helper.make_tensor_value_info
    inputs = [vi("q", F32, [1, None, H * D]), vi("k", F32, [1, None, KV * D]), vi("v", F32, [1, None, KV * D]),
              vi("attention_mask", I64, [1, None]), vi("pk", F16, [1, KV, CAP, D]), vi("pv", F16, [1, KV, CAP, D])]
    outputs = [vi("out", F32, [1, None, H * D]), vi("ok", F16, [1, KV, CAP, D]), vi("ov", F16, [1, KV, CAP, D])]
    return inputs, outputs


def _model(nodes: list, inits: dict[str, np.ndarray], name: str) -> ModelProto:
    g = helper.make_graph(nodes, name, *_io(), [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def gqa_model() -> ModelProto:
    """What the exporter writes for an fp16 cache: casts around GroupQueryAttention (rotary inside)."""
    n = helper.make_node
    cos, sin = _rope()
    inits = {"cos": cos.astype(np.float16), "sin": sin.astype(np.float16), "one": np.array([1], np.int64),
             "one_s": np.array(1, np.int64)}
    nodes = [n("ReduceSum", ["attention_mask", "one"], ["ts"], keepdims=0), n("Sub", ["ts", "one"], ["sl64"]),
             n("Cast", ["sl64"], ["seqlens"], to=6), n("Shape", ["attention_mask"], ["shp"]),
             n("Gather", ["shp", "one_s"], ["tot64"], axis=0), n("Cast", ["tot64"], ["total"], to=6)]
    nodes += [n("Cast", [x], [x + "16"], to=10) for x in "qkv"]
    nodes.append(n("GroupQueryAttention", ["q16", "k16", "v16", "pk", "pv", "seqlens", "total", "cos", "sin"],
                   ["o16", "ok", "ov"], domain="com.microsoft", num_heads=H, kv_num_heads=KV, scale=1 / 8.0,
                   do_rotary=1, rotary_interleaved=0, local_window_size=-1))
    nodes.append(n("Cast", ["o16"], ["out"], to=1))
    return _model(nodes, inits, "gqa")


def ops_model(fp16_matmul: bool = False) -> ModelProto:
    """The same attention in standard ops, each KV head's past read once (see the module docstring)."""
    n = helper.make_node
    cos, sin = _rope()
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"cos": cos, "sin": sin, "one": i64(1), "zero": i64(0), "two": i64(2), "zero_s": np.array(0, np.int64),
             "zf": np.array(0.0, np.float32), "ninf": np.array(-np.inf, np.float32), "sg": i64(1, G),
             "col": i64(-1, 1), "hidx": np.arange(KV, dtype=np.int64).reshape(1, KV, 1, 1),
             "pos_shape": i64(1, 1, -1, 1),
             "q5": i64(1, -1, KV, G, D), "qg_shape": i64(1, KV, -1, D), "kv4": i64(1, -1, KV, D),
             "o5": i64(1, KV, -1, G, D), "o3": i64(1, -1, H * D), "scale": np.array(1 / 8.0, np.float32)}
    nodes = [  # once per pass: total T, positions p..T-1, scatter indices [1, KV, S, 3], mask [S*G, T]
        n("ReduceSum", ["attention_mask", "one"], ["tot"], keepdims=0), n("Shape", ["q"], ["qshape"]),
        n("Gather", ["qshape", "one"], ["S"], axis=0), n("Sub", ["tot", "S"], ["p"]), n("Squeeze", ["p"], ["p0"]),
        n("Squeeze", ["tot"], ["t0"]), n("Constant", [], ["one0"], value_int=1),
        n("Range", ["p0", "t0", "one0"], ["pos"]), n("Unsqueeze", ["pos", "zero"], ["pos_ids"]),
        n("Reshape", ["pos", "pos_shape"], ["pos4"]), n("Mul", ["pos4", "zero"], ["z4"]),
        n("Add", ["hidx", "z4"], ["h4"]), n("Add", ["pos4", "h4"], ["tmp"]), n("Sub", ["tmp", "h4"], ["p4"]),
        n("Mul", ["h4", "zero"], ["b4"]), n("Concat", ["b4", "h4", "p4"], ["sidx"], axis=-1),
        n("Range", ["zero_s", "t0", "one0"], ["tr"]), n("Unsqueeze", ["pos", "one"], ["posc1"]),
        n("Expand", ["posc1", "sg"], ["posx"]), n("Reshape", ["posx", "col"], ["posc"]),
        n("LessOrEqual", ["tr", "posc"], ["allowed"]), n("Where", ["allowed", "zf", "ninf"], ["mask"]),
        # rotary on q and k
        n("RotaryEmbedding", ["q", "pos_ids", "cos", "sin"], ["qr"], domain="com.microsoft", num_heads=H,
          interleaved=0),
        n("RotaryEmbedding", ["k", "pos_ids", "cos", "sin"], ["kr"], domain="com.microsoft", num_heads=KV,
          interleaved=0)]
    for x, src, buf, out in (("k", "kr", "pk", "ok"), ("v", "v", "pv", "ov")):  # write in place, read the prefix
        nodes += [n("Reshape", [src, "kv4"], [x + "4"]), n("Transpose", [x + "4"], [x + "t"], perm=[0, 2, 1, 3]),
                  n("Cast", [x + "t"], [x + "t16"], to=10), n("ScatterND", [buf, "sidx", x + "t16"], [out]),
                  n("Slice", [out, "zero", "tot", "two"], [x + "s16"])]
        if not fp16_matmul:
            nodes.append(n("Cast", [x + "s16"], [x + "s"], to=1))
    nodes += [n("Reshape", ["qr", "q5"], ["q5r"]), n("Transpose", ["q5r"], ["q5t"], perm=[0, 2, 1, 3, 4]),
              n("Reshape", ["q5t", "qg_shape"], ["qg"])]  # [1, KV, S*G, D]: a group's query heads as rows
    if fp16_matmul:
        nodes += [n("Cast", ["qg"], ["qg16"], to=10), n("Transpose", ["ks16"], ["kT"], perm=[0, 1, 3, 2]),
                  n("MatMul", ["qg16", "kT"], ["sc16"]), n("Cast", ["sc16"], ["sc0"], to=1),
                  n("Mul", ["sc0", "scale"], ["sc"])]
    else:
        nodes.append(n("FusedMatMul", ["qg", "ks"], ["sc"], domain="com.microsoft", transB=1, alpha=1 / 8.0))
    nodes += [n("Add", ["sc", "mask"], ["scm"]), n("Softmax", ["scm"], ["pr"], axis=-1)]
    if fp16_matmul:
        nodes += [n("Cast", ["pr"], ["pr16"], to=10), n("MatMul", ["pr16", "vs16"], ["o16"]),
                  n("Cast", ["o16"], ["og"], to=1)]
    else:
        nodes.append(n("MatMul", ["pr", "vs"], ["og"]))
    nodes += [n("Reshape", ["og", "o5"], ["o5r"]), n("Transpose", ["o5r"], ["o5t"], perm=[0, 2, 1, 3, 4]),
              n("Reshape", ["o5t", "o3"], ["out"])]
    return _model(nodes, inits, "ops16" if fp16_matmul else "ops")


def session(model: ModelProto, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def runner(sess: ort.InferenceSession, past: int, rows: int, seed: int = 0
           ) -> tuple[Callable[[], np.ndarray], np.ndarray, np.ndarray]:
    """A pass of ``rows`` new rows after ``past`` cached ones, bound like the runtime binds it; (run, K, V)."""
    rng = np.random.default_rng(seed)
    pk = (rng.standard_normal((1, KV, CAP, D)) * 0.5).astype(np.float16)
    pv = rng.standard_normal((1, KV, CAP, D)).astype(np.float16)
    opk, opv = ort.OrtValue.ortvalue_from_numpy(pk), ort.OrtValue.ortvalue_from_numpy(pv)
    io = sess.io_binding()
    for name, width in (("q", H * D), ("k", KV * D), ("v", KV * D)):
        io.bind_cpu_input(name, rng.standard_normal((1, rows, width)).astype(np.float32))
    io.bind_cpu_input("attention_mask", np.ones((1, past + rows), np.int64))
    io.bind_ortvalue_input("pk", opk)
    io.bind_ortvalue_output("ok", opk)
    io.bind_ortvalue_input("pv", opv)
    io.bind_ortvalue_output("ov", opv)
    out = np.zeros((1, rows, H * D), np.float32)
    io.bind_output("out", "cpu", 0, np.float32, out.shape, out.ctypes.data)

    def go() -> np.ndarray:
        sess.run_with_iobinding(io)
        return out
    return go, pk, pv


def run(threads: int, contexts: list[int], rows: list[int]) -> dict:
    models = {"gqa": session(gqa_model(), threads), "ops": session(ops_model(), threads),
              "ops16": session(ops_model(True), threads)}
    report: dict = {"threads": threads, "checks": [], "us": []}
    for s in rows:
        res = {}
        for name, sess in models.items():
            go, pk, pv = runner(sess, 300, s)
            res[name] = (go().copy(), pk[:, :, 300:300 + s].copy(), pv[:, :, 300:300 + s].copy(), pk[:, :, :300].copy())
        for name in ("ops", "ops16"):
            check = {"rows": s, "graph": name, "max_abs_out_diff": float(np.abs(res[name][0] - res["gqa"][0]).max()),
                     "v_rows_equal": bool(np.array_equal(res[name][2], res["gqa"][2])),
                     "past_untouched": bool(np.array_equal(res[name][3], res["gqa"][3]))}
            report["checks"].append(check)
            print(check)
    for s in rows:
        for past in contexts:
            gos = {name: runner(sess, past, s)[0] for name, sess in models.items()}
            t: dict[str, list[float]] = {name: [] for name in gos}
            for i in range(60):
                for name, go in gos.items():
                    t0 = time.perf_counter()
                    go()
                    if i >= 5:
                        t[name].append(time.perf_counter() - t0)
            row = {"rows": s, "past": past, **{k: round(statistics.median(v) * 1e6, 1) for k, v in t.items()}}
            report["us"].append(row)
            print(f"threads {threads} rows {s} past {past}: " + "  ".join(f"{k} {row[k]:7.1f} us" for k in t))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--contexts", type=int, nargs="+", default=[150, 1024, 2048, 4000])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "attention_ops.json")
    args = ap.parse_args(argv)
    reports = [run(t, args.contexts, args.rows) for t in args.threads]
    args.out.write_text(json.dumps({"onnxruntime": ort.__version__, "runs": reports}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
