"""What the split graph's block offsets cost plain decoding (issue 18: edge-spec AR vs llama.cpp AR).

    python benchmarks/offset_cost.py --bundle DEMO [--threads 1 2] [--rounds 2] [--extra NAME=BUNDLE ...] \
        [--json out.json]

``--gguf-mode split`` (the default) writes a Q4_1 matmul as ``MatMulNBits(x; d, q, z) + blocksum(x) @ M``
(docs/export.md): per matmul a Reshape, a ReduceSum, an fp32 MatMul over the K/32 block sums and an Add, with M
[K/32, N] in fp32 — one more bit per weight read each step. This script rewrites copies of the bundle's target graph
and times plain decoding on each, every variant in its own process, variants alternating round by round:

* ``split``: the graph as exported (exact weights);
* ``offsets int8``: M as an 8-bit MatMulNBits (blocks of 16 along K/32, symmetric, accuracy level 4): a quarter of
  the offset bytes, offsets no longer exact (the largest relative error is printed);
* ``no offsets``: the offset path removed — *wrong numerics*, a timing bound only: what any encoding of the offsets
  could at most win;
* ``offsets cache-hot``: every layer's offset MatMul reads layer 0's M — *wrong numerics*, a timing bound only: what
  is left of the offset path's cost when reading M (1/32 of the weights in fp32) costs nothing;
* ``symmetric``: no zero-point input (MatMulNBits' default zero point 8, so D = (q - 8)*s) and M = m + 8*s, the
  split's other exact form (the count of offsets fp32 cannot hold exactly is printed; 0 for SmolLM2's Q4_1):
  ONNX Runtime's M=1 kernel for symmetric 4-bit blocks instead of the zero-point one;
* ``--extra NAME=BUNDLE``: any other bundle of the same target (e.g. ``edge-spec export ... --gguf-mode fast``).

Each measurement: ``Engine.load(drafting="none")`` at context 4096, warm-up on one prompt, best of 2 passes over 6
chat prompts (benchmarks/chat_prompts.py) x 96 greedy tokens. ``--micro``: instead, one process times a single-row
pass of every variant's target graph (100 cached positions, plain ``session.run``), variants interleaved in blocks of
40 passes, 12 blocks each, medians compared — far less noisy on a shared VM than whole texts. A benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def rewrite(src: Path, dst: Path, kind: str) -> float:
    """Copy bundle ``src`` to ``dst`` with its target graph's offset path rewritten (``int8``, ``none``, ``hot`` or
    ``sym``); returns the largest relative error of the rewritten offsets for ``int8``, the count of inexact offsets
    for ``sym``, 0 for ``none`` and ``hot`` (whose numerics are simply wrong)."""
    import onnx
    from onnx import helper, numpy_helper

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = dst / "target" / "model.onnx"
    model = onnx.load(str(path))  # with its external data: the int8 variant adds initializers
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes, rename, worst = [], {}, 0.0
    by_name = {node.name: node for node in graph.node}
    if kind == "sym":
        return _symmetric(graph, inits, by_name, dst, model, path)
    for node in graph.node:
        offset_mm = node.name.endswith("/offsets/MatMul")
        if kind == "hot":
            if offset_mm:
                layer = node.input[1].split("/")[2]  # "/model/layers.N/..." -> "layers.N"
                node.input[1] = node.input[1].replace(layer, "layers.0")
            nodes.append(node)
            continue
        if kind == "none":
            if node.name.endswith("/offsets/Add"):
                rename[node.output[0]] = node.input[0]
                continue
            if offset_mm or "/blocksum32/" in node.name:
                continue
        elif offset_mm:
            m = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)  # [K/32, N]
            kb, n = m.shape
            block = 16
            nb = -(-kb // block)
            w = np.zeros((nb * block, n), np.float32)
            w[:kb] = m
            w = w.T.reshape(n, nb, block)
            scale = np.abs(w).max(-1) / 127.0
            scale[scale == 0] = 1.0
            q = np.clip(np.round(w / scale[..., None]), -127, 127)
            worst = max(worst, float(np.abs(q * scale[..., None] - w).max() / max(np.abs(w).max(), 1e-30)))
            name = node.input[1]
            graph.initializer.extend([numpy_helper.from_array((q + 128).astype(np.uint8), name + ".q8"),
                                      numpy_helper.from_array(scale.astype(np.float32).reshape(-1), name + ".s8")])
            node = helper.make_node("MatMulNBits", [node.input[0], name + ".q8", name + ".s8"], list(node.output),
                                    name=node.name, domain="com.microsoft", K=kb, N=n, bits=8, block_size=block,
                                    accuracy_level=4)
        nodes.append(node)
    for node in nodes:
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    del graph.node[:]
    graph.node.extend(nodes)
    _save(model, dst, path)
    return worst


def _save(model, dst: Path, path: Path) -> None:
    import onnx

    (dst / "target" / "model.onnx.data").unlink()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")


def _symmetric(graph, inits: dict, by_name: dict, dst: Path, model, path: Path) -> float:
    """Drop every split MatMulNBits' zero points (default 8) and fold (8 - z)*s into its offsets M [K/32, N];
    returns the count of new offsets float32 does not hold exactly (the split stays exact when it is 0)."""
    from onnx import numpy_helper

    inexact = 0
    for node in graph.node:
        if node.op_type != "MatMulNBits" or len(node.input) < 4 or not node.input[3]:
            continue
        offsets = by_name.get(node.name.rsplit("/MatMulNBits", 1)[0] + "/offsets/MatMul")
        attrs = {a.name: a.i for a in node.attribute}
        if offsets is None or attrs["bits"] != 4:
            continue
        n, nb = attrs["N"], attrs["K"] // attrs["block_size"]
        zp = numpy_helper.to_array(inits[node.input[3]]).reshape(n, -1)
        z = np.stack([zp & 15, zp >> 4], -1).reshape(n, -1)[:, :nb].astype(np.float64)
        s = numpy_helper.to_array(inits[node.input[2]]).reshape(n, nb).astype(np.float64)
        m = numpy_helper.to_array(inits[offsets.input[1]]).astype(np.float64) + ((8 - z) * s).T
        inexact += int((m.astype(np.float32).astype(np.float64) != m).sum())
        inits[offsets.input[1]].CopyFrom(numpy_helper.from_array(m.astype(np.float32), offsets.input[1]))
        del node.input[3]
    _save(model, dst, path)
    return float(inexact)


def micro(paths: dict[str, Path], threads: int, blocks: int = 12, per_block: int = 40) -> dict[str, float]:
    """Median ms of one single-row pass (100 cached positions) of each bundle's target graph, interleaved."""
    import time

    import onnxruntime as ort

    sessions = {}
    for name, bundle in paths.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.log_severity_level = threads, 3
        sessions[name] = ort.InferenceSession(str(bundle / "target" / "model.onnx"), opts,
                                              providers=["CPUExecutionProvider"])
    first = next(iter(sessions.values()))
    past = 100
    feeds = {"input_ids": np.array([[1234]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64)}
    rng = np.random.default_rng(0)
    for inp in first.get_inputs():
        if inp.name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in inp.type else np.float32
            feeds[inp.name] = (rng.standard_normal((1, inp.shape[1], past, inp.shape[3])) * 0.5).astype(dtype)
    out = [first.get_outputs()[0].name]
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for s in sessions.values():
        for _ in range(5):
            s.run(out, feeds)
    for _ in range(blocks):
        for name, s in sessions.items():
            t0 = time.perf_counter()
            for _ in range(per_block):
                s.run(out, feeds)
            times[name].append((time.perf_counter() - t0) / per_block * 1e3)
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=BUNDLE")
    ap.add_argument("--work", type=Path, default=HERE / "out" / "offset_cost")
    ap.add_argument("--micro", action="store_true", help="time single-row passes in one process (see above)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        from ar_vs_genai import worker  # its measurement: best of 2 passes over 6 prompts x 96 tokens, warmed up

        print(json.dumps(worker("edge-spec", Path(args.worker[0]), int(args.worker[1]), 6, 96, [])))
        return 0
    from edge_spec.demo import resolve_bundle

    src = resolve_bundle(args.bundle)
    variants = {"split": src}
    errors = {}
    for kind, name in (("int8", "offsets int8"), ("none", "no offsets (wrong numerics: a bound)"),
                       ("hot", "offsets cache-hot (wrong numerics: a bound)"), ("sym", "symmetric")):
        errors[name] = rewrite(src, args.work / kind, kind)
        variants[name] = args.work / kind
    for spec in args.extra:
        name, _, path = spec.partition("=")
        variants[name] = Path(path)
    print(f"offsets int8: largest relative error of an offset {errors['offsets int8']:.2e}; symmetric: "
          f"{int(errors['symmetric'])} offsets float32 cannot hold exactly", flush=True)
    if args.micro:
        return _report_micro(variants, args, src, errors)
    results: dict[str, dict[int, list[float]]] = {v: {t: [] for t in args.threads} for v in variants}
    for r in range(args.rounds):
        for t in args.threads:
            for name, path in variants.items():
                out = subprocess.run([sys.executable, __file__, "--bundle", str(src), "--worker", str(path), str(t)],
                                     capture_output=True, text=True, check=True)
                results[name][t].append(round(json.loads(out.stdout.strip().splitlines()[-1]), 1))
                print(f"round {r + 1}, {t} thread(s), {name}: {results[name][t][-1]} tok/s", flush=True)
    print("\n| variant | " + " | ".join(f"{t} thread(s), tok/s (rounds)" for t in args.threads) + " | "
          + " | ".join(f"best / split's, {t}t" for t in args.threads) + " |")
    print("|---|" + "---|" * (2 * len(args.threads)))
    for name, by in results.items():
        cells = [", ".join(map(str, by[t])) for t in args.threads]
        ratios = [f"{max(by[t]) / max(results['split'][t]):.2f}" for t in args.threads]
        print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(src), "results": results, "offset_int8_error": errors},
                                        indent=1) + "\n")
    return 0


def _report_micro(variants: dict[str, Path], args: argparse.Namespace, src: Path, errors: dict) -> int:
    """``--micro``: one process per thread count, single-row passes of every variant interleaved."""
    results: dict[str, dict[int, float]] = {v: {} for v in variants}
    for t in args.threads:
        for name, ms in micro(variants, t).items():
            results[name][t] = round(ms, 2)
            print(f"{t} thread(s), {name}: {ms:.2f} ms per single-row pass", flush=True)
    print("\n| variant | " + " | ".join(f"{t} thread(s), ms" for t in args.threads) + " | "
          + " | ".join(f"split's / it, {t}t" for t in args.threads) + " |")
    print("|---|" + "---|" * (2 * len(args.threads)))
    for name, by in results.items():
        ratios = [f"{results['split'][t] / by[t]:.2f}" for t in args.threads]
        print(f"| {name} | " + " | ".join(str(by[t]) for t in args.threads) + " | " + " | ".join(ratios) + " |")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(src), "mode": "micro", "ms_per_pass": results,
                                         "offset_errors": errors}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
