"""A compiled K-quant matmul (kernels/kquant, custom op ``edge_spec::GgufMatMul``) against today's encoding.

    bash kernels/kquant/build.sh
    python benchmarks/probes/kquant_kernel.py [--gguf qwen2.5-coder-1.5b-instruct-q4_k_m.gguf] [--threads 1 2]
        [--rows 1 2 3 5] [--repeats 15] [--llama-bench] [--out benchmarks/results/kquant_kernel.json]

Issue 44, item 4: is a kernel reading the GGUF's own Q4_K / Q6_K blocks worth a build step?

Correctness, on the first tensor of each kind in the file (5 rows of activations, Gaussian and heavy-tailed):
the op against float64 ``A @ dequantize(W)^T`` (gguf-py), against the same product with A first rounded to
llama.cpp's Q8_K blocks (numpy, the arithmetic llama.cpp's CPU backend does, in exact math), and today's graph
node on the same input; a 5-row pass against five 1-row passes and 1 against 2 threads, bit for bit.

Speed: for each kind (q, k, o, gate, up, v and down in either type, the LM head), one graph holding that kind's
tensors of every layer (so the weights stream from memory, as in a decode step, rather than sit in cache): the
custom op on the file's bytes, and today's encoding of the same tensors (``own_build._convert`` with the split
policy, ``graph_linear.linear`` at accuracy level 4, exactly what the exporter writes), per node. Sessions use the
runtime's options (``session_options``, spinning at 2 threads as the target does); outputs are bound once (IO
binding); variants, thread counts and row counts alternate within each repeat; medians. The per-node medians
times the kinds' counts give the quantized matmuls' share of a decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "kernels/kquant/libedge_spec_kquant.so"
GGUF = Path("/work/cache/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
GGML_TYPE = {"Q4_K": 12, "Q6_K": 14}
# (kind, tensor name suffix, GGUF type): every linear weight of the coder target, by the file's types
KINDS = [("q", "attn_q.weight", "Q4_K"), ("k", "attn_k.weight", "Q4_K"), ("v", "attn_v.weight", "Q4_K"),
         ("v", "attn_v.weight", "Q6_K"), ("o", "attn_output.weight", "Q4_K"), ("gate", "ffn_gate.weight", "Q4_K"),
         ("up", "ffn_up.weight", "Q4_K"), ("down", "ffn_down.weight", "Q4_K"), ("down", "ffn_down.weight", "Q6_K"),
         ("head", "output.weight", "Q6_K")]


def tensors_of(reader: object, suffix: str, type_name: str) -> list:
    """The file's tensors named ``blk.<i>.<suffix>`` (or ``suffix``) of ``type_name``, in layer order."""
    found = [t for t in reader.tensors if (t.name == suffix or t.name.endswith("." + suffix))
             and t.tensor_type.name == type_name]
    return sorted(found, key=lambda t: int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1)


def _model(nodes: list, inits: list, k: int, outs: list[tuple[str, int]]) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, "M", n]) for o, n in outs],
                              inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("edge_spec", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="edge-spec")
    model.ir_version = 10
    return model.SerializeToString()


def interleave8(data: np.ndarray, type_name: str) -> np.ndarray:
    """Q4_K / Q6_K rows [N, nb * bytes] -> the same bytes interleaved by 8 rows, as the exporter writes them."""
    from edge_spec.export.gguf_kquant import interleave8 as by_type

    return by_type(data, GGML_TYPE[type_name])


def custom_model(ts: list, interleave: int = 0) -> bytes:
    """A [1, M, K] -> one GgufMatMul per tensor, on the tensor's bytes as stored in the file (``interleave`` 8:
    the same bytes reordered by 8 rows)."""
    from onnx import helper, numpy_helper

    nodes, inits, outs = [], [], []
    for i, t in enumerate(ts):
        data = np.ascontiguousarray(np.asarray(t.data), dtype=np.uint8)  # [N, bytes per row]
        if interleave:
            data = interleave8(data, t.tensor_type.name)
        inits.append(numpy_helper.from_array(data, f"w{i}"))
        nodes.append(helper.make_node("GgufMatMul", ["A", f"w{i}"], [f"y{i}"], name=f"g{i}", domain="edge_spec",
                                      ggml_type=GGML_TYPE[t.tensor_type.name], interleave=interleave))
        outs.append((f"y{i}", data.shape[0]))
    return _model(nodes, inits, int(ts[0].shape[0]), outs)


def today_model(ts: list) -> tuple[bytes, list[str]]:
    """A [1, M, K] -> each tensor as the exporter encodes it today (split policy, accuracy level 4); the ops used."""
    from onnx import helper

    from edge_spec.export.graph_linear import linear as _linear
    from edge_spec.export.graph_writer import GraphWriter
    from edge_spec.export.own_build import Policy, _convert

    g, outs, ops = GraphWriter(), [], []
    for i, t in enumerate(ts):
        w, op = _convert(t, Policy(mode="split", accuracy_level=4))
        ops.append(op)
        y = _linear(g, "A", w, f"/l{i}", 4)
        g.nodes.append(helper.make_node("Identity", [y], [f"y{i}"], name=f"/l{i}/out"))
        outs.append((f"y{i}", int(t.shape[1])))
    return _model(g.nodes, g.inits, int(ts[0].shape[0]), outs), sorted(set(ops))


def session(model: bytes, threads: int, lib: Path) -> object:
    import onnxruntime as ort

    from edge_spec import kernels
    from edge_spec.runtime.options import session_options

    so = session_options(threads=threads, spin=threads > 1)  # registers the pip-built library when there is one
    if not kernels.available():
        so.register_custom_ops_library(str(lib))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def run(sess: object, a: np.ndarray) -> list[np.ndarray]:
    return sess.run(None, {"A": a.reshape(1, -1, a.shape[-1]).astype(np.float32)})


# ------------------------------------------------------------------------------------------------ correctness
def q8k_dequant(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` [M, K] rounded as llama.cpp's quantize_row_q8_K does (float32), returned as float64 d * q."""
    m, k = a.shape
    x = a.astype(np.float32).reshape(m, k // 256, 256)
    ax = np.abs(x)
    amax = ax.max(axis=-1)
    first = np.argmax(ax == amax[..., None], axis=-1)  # the first value of largest magnitude, with its sign
    mx = np.take_along_axis(x, first[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (np.float32(-127.0) / mx).astype(np.float32)
        q = np.minimum(127, np.rint((iscale[..., None] * x).astype(np.float32)))
        d = np.where(amax > 0, (np.float32(1.0) / iscale).astype(np.float32), 0)
    q = np.where(amax[..., None] > 0, q, 0)
    return (d[..., None].astype(np.float64) * q).reshape(m, k)


def check(t: object, lib: Path, rng: np.random.Generator) -> dict:
    """Errors of the op, of llama.cpp's rounding and of today's node on one tensor; row and thread invariance."""
    from gguf.quants import dequantize

    w = np.asarray(dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float64)  # [N, K]
    k = w.shape[1]
    ours = {th: session(custom_model([t]), th, lib) for th in (1, 2)}
    x8 = session(custom_model([t], 8), 2, lib)
    today = {th: session(today_model([t])[0], th, lib) for th in (1, 2)}
    out: dict = {"tensor": t.name, "type": t.tensor_type.name, "shape": [int(w.shape[0]), k]}
    for dist in ("gaussian", "student_t3"):
        a = (rng.standard_normal((5, k)) if dist == "gaussian" else rng.standard_t(3, (5, k))).astype(np.float32)
        ref = a.astype(np.float64) @ w.T
        llama = q8k_dequant(a) @ w.T
        y = run(ours[2], a)[0].reshape(5, -1)
        y_rows = np.concatenate([run(ours[2], a[r:r + 1])[0].reshape(1, -1) for r in range(5)])
        y_1t = run(ours[1], a)[0].reshape(5, -1)
        z = run(today[2], a)[0].reshape(5, -1)
        z_rows = np.concatenate([run(today[2], a[r:r + 1])[0].reshape(1, -1) for r in range(5)])
        scale = float(np.sqrt(np.mean(ref ** 2)))

        def rel(x: np.ndarray, r: np.ndarray = ref, scale: float = scale) -> float:
            return float(np.sqrt(np.mean((x.astype(np.float64) - r) ** 2)) / scale)

        out[dist] = {
            "op_vs_exact": rel(y), "llamacpp_q8k_vs_exact": rel(llama), "op_vs_llamacpp_q8k": rel(y, llama),
            "op_max_abs_vs_llamacpp_q8k": float(np.abs(y - llama).max()), "today_vs_exact": rel(z),
            "op_5rows_eq_5x1row": bool(np.array_equal(y, y_rows)),
            "op_1thread_eq_2threads": bool(np.array_equal(y, y_1t)),
            "today_5rows_eq_5x1row": bool(np.array_equal(z, z_rows)),
            **x8_check(x8, a, llama, rel),
            "today_5rows_vs_5x1row_max_abs": float(np.abs(z - z_rows).max()),
        }
    return out


def x8_check(sess: object, a: np.ndarray, llama: np.ndarray, rel: object) -> dict:
    """The interleaved-by-8 layout: error against llama.cpp's arithmetic; 5 rows == 5 x 1 row."""
    y = run(sess, a)[0].reshape(len(a), -1)
    rows = np.concatenate([run(sess, a[r:r + 1])[0].reshape(1, -1) for r in range(len(a))])
    return {"x8_vs_exact": rel(y), "x8_vs_llamacpp_q8k": rel(y, llama),
            "x8_5rows_eq_5x1row": bool(np.array_equal(y, rows))}


# ------------------------------------------------------------------------------------------------ timing
def time_kind(ts: list, lib: Path, threads: list[int], rows: list[int], repeats: int) -> dict:
    """Median ms per node of the custom op and today's encoding, per thread count and row count, interleaved."""
    import onnxruntime as ort

    k, ns = int(ts[0].shape[0]), [int(t.shape[1]) for t in ts]
    models = {"gguf_op": custom_model(ts), "gguf_op_x8": custom_model(ts, 8)}
    models["today"], ops = today_model(ts)
    rng = np.random.default_rng(0)
    acts = {m: rng.standard_normal((1, m, k)).astype(np.float32) for m in rows}
    runs = []  # (variant, threads, rows, session, binding)
    for variant, model in models.items():
        for th in threads:
            sess = session(model, th, lib)
            for m in rows:
                b = sess.io_binding()
                b.bind_ortvalue_input("A", ort.OrtValue.ortvalue_from_numpy(acts[m]))
                for i, n in enumerate(ns):
                    b.bind_ortvalue_output(f"y{i}", ort.OrtValue.ortvalue_from_numpy(np.zeros((1, m, n), np.float32)))
                runs.append((variant, th, m, sess, b))
    times: dict = {}
    cpu: dict = {}
    for r in runs:  # warm up: first runs pay page faults and the pool's start
        for _ in range(2):
            r[3].run_with_iobinding(r[4])
    for rep in range(repeats):
        order = runs[rep % len(runs):] + runs[:rep % len(runs)]
        for variant, th, m, sess, b in order:
            c0, t0 = time.thread_time(), time.perf_counter()
            sess.run_with_iobinding(b)
            t1, c1 = time.perf_counter(), time.thread_time()
            times.setdefault((variant, th, m), []).append((t1 - t0) * 1e3 / len(ts))
            if th == 1:  # one thread: ONNX Runtime runs every kernel on this thread, so its CPU time is the work's
                cpu.setdefault((variant, th, m), []).append((c1 - c0) * 1e3 / len(ts))
    return {"nodes": len(ts), "k": k, "n": ns[0], "today_ops": ops,
            "file_bytes_per_node": int(np.asarray(ts[0].data).nbytes),
            "ms_per_node": {f"{v}/{th}t/{m}r": statistics.median(x) for (v, th, m), x in times.items()},
            "cpu_ms_per_node": {f"{v}/{th}t/{m}r": statistics.median(x) for (v, th, m), x in cpu.items()}}


def llama_bench(gguf: Path, threads: int) -> dict | None:
    """llama.cpp's tg32 at ``threads`` (one run of llama-bench), or None when it is not built."""
    from benchmarks.lib.llamacpp import bin_dir

    d = bin_dir()
    if d is None or not (d / "llama-bench").is_file():
        return None
    cmd = [str(d / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", "32", "-t", str(threads), "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    row = json.loads(p.stdout)[0]
    return {"threads": threads, "tok_s": row["avg_ts"], "ms_per_token": 1e3 / row["avg_ts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=GGUF)
    ap.add_argument("--lib", type=Path, default=LIB,
                    help="the custom-op library built by kernels/kquant/build.sh, when pip did not build it "
                    "(edge_spec/kernels.py)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 5])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--kinds", nargs="+", default=None, help="only these kinds (q k v o gate up down head)")
    ap.add_argument("--no-timing", action="store_true", help="correctness only")
    ap.add_argument("--llama-bench", action="store_true", help="also run llama-bench tg32 once (largest --threads)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/kquant_kernel.json")
    ap.add_argument("--report", type=Path, default=None, help="only print the table of a saved JSON")
    args = ap.parse_args()
    if args.report:
        print(table(json.loads(args.report.read_text())))
        return
    if not args.lib.is_file():
        sys.exit(f"no custom-op library at {args.lib}: build it with `bash kernels/kquant/build.sh`")
    import gguf

    reader = gguf.GGUFReader(str(args.gguf))
    kinds = [k for k in KINDS if args.kinds is None or k[0] in args.kinds]
    rng = np.random.default_rng(44)
    result: dict = {"gguf": args.gguf.name, "load_before": os.getloadavg(), "checks": [], "timing": {}}
    for kind, suffix, tname in kinds:
        c = check(tensors_of(reader, suffix, tname)[0], args.lib, rng)
        result["checks"].append({"kind": kind, **c})
        g = c["gaussian"]
        print(f"{kind:5s} {tname} {c['shape']}: op {g['op_vs_exact']:.2e} / llama.cpp Q8_K "
              f"{g['llamacpp_q8k_vs_exact']:.2e}"
              f" / today {g['today_vs_exact']:.2e} (rms rel. to exact); op vs llama.cpp's arithmetic "
              f"{g['op_vs_llamacpp_q8k']:.1e}; 5 rows == 5 x 1 row: op {g['op_5rows_eq_5x1row']}, "
              f"today {g['today_5rows_eq_5x1row']} ({g['today_5rows_vs_5x1row_max_abs']:.1e})"
              + (f"; x8 {g['x8_vs_llamacpp_q8k']:.1e}, {g['x8_5rows_eq_5x1row']}" if "x8_vs_exact" in g else ""),
              flush=True)
    if not args.no_timing:
        for kind, suffix, tname in kinds:
            r = time_kind(tensors_of(reader, suffix, tname), args.lib, args.threads, args.rows, args.repeats)
            result["timing"][f"{kind}/{tname}"] = r
            print(kind, tname, {k: round(v, 3) for k, v in r["ms_per_node"].items()}, flush=True)
        result["step_ms"] = step_estimate(result["timing"], args.threads, args.rows)
        result["step_cpu_ms"] = step_estimate(result["timing"], args.threads, args.rows, "cpu_ms_per_node")
        print(json.dumps({"wall": result["step_ms"], "cpu (1 thread)": result["step_cpu_ms"]}, indent=1))
    result["load_after"] = os.getloadavg()
    if args.llama_bench:
        result["llama_bench"] = llama_bench(args.gguf, max(args.threads))
        print("llama-bench", result["llama_bench"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if result["timing"]:
        print("ms per node, file rows / interleaved by 8 / today's encoding:\n" + table(result))
    print(f"wrote {args.out}")


def table(result: dict) -> str:
    """Markdown: ms per node (1 thread: CPU time; 2 threads: wall) and the step's sum, per variant."""
    variants = ("gguf_op", "gguf_op_x8", "today")
    cols = [(key, th, m) for key, th in (("cpu_ms_per_node", 1), ("ms_per_node", 2)) for m in (1, 2, 5)]
    head = " | ".join(f"{'CPU' if k.startswith('cpu') else 'wall'} {th}t {m}r" for k, th, m in cols)
    lines = [f"| kind (nodes, file MB each) | {head} |", "|---" * (len(cols) + 1) + "|"]

    def cell(d: dict, th: int, m: int) -> str:
        return " / ".join(f"{d[f'{v}/{th}t/{m}r']:.3g}" if f"{v}/{th}t/{m}r" in d else "-" for v in variants)

    for name, r in result["timing"].items():
        mb = r["file_bytes_per_node"] / 1e6
        cells = " | ".join(cell(r[k], th, m) for k, th, m in cols)
        lines.append(f"| {name} ({r['nodes']}, {mb:.2f}) | {cells} |")
    steps = {"cpu_ms_per_node": result.get("step_cpu_ms", {}), "ms_per_node": result.get("step_ms", {})}
    cells = " | ".join(f"**{cell(steps[k], th, m)}**" for k, th, m in cols)
    lines.append(f"| **step, all quantized matmuls** | {cells} |")
    return "\n".join(lines)


def step_estimate(timing: dict, threads: list[int], rows: list[int], key: str = "ms_per_node") -> dict:
    """The quantized matmuls of one decode step (every layer's nodes + the head), ms, per variant."""
    out: dict = {}
    for th in threads:
        for m in rows:
            for v in ("gguf_op", "gguf_op_x8", "today"):
                name = f"{v}/{th}t/{m}r"
                if all(name in r[key] for r in timing.values()):
                    out[name] = sum(r["nodes"] * r[key][name] for r in timing.values())
    return out


if __name__ == "__main__":
    main()
