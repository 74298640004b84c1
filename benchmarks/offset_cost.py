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
* ``--extra NAME=BUNDLE``: any other bundle of the same target (e.g. ``edge-spec export ... --gguf-mode fast``).

Each measurement: ``Engine.load(drafting="none")`` at context 4096, warm-up on one prompt, best of 2 passes over 6
chat prompts (benchmarks/chat_prompts.py) x 96 greedy tokens. A benchmark, not a test.
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
    """Copy bundle ``src`` to ``dst`` with its target graph's offset path rewritten (``int8`` or ``none``); returns
    the largest relative error of the rewritten offsets (0 for ``none``, whose numerics are simply wrong)."""
    import onnx
    from onnx import helper, numpy_helper

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = dst / "target" / "model.onnx"
    model = onnx.load(str(path))  # with its external data: the int8 variant adds initializers
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes, rename, worst = [], {}, 0.0
    for node in graph.node:
        offset_mm = node.name.endswith("/offsets/MatMul")
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
    (dst / "target" / "model.onnx.data").unlink()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=BUNDLE")
    ap.add_argument("--work", type=Path, default=HERE / "out" / "offset_cost")
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
    for kind, name in (("int8", "offsets int8"), ("none", "no offsets (wrong numerics: a bound)")):
        errors[name] = rewrite(src, args.work / kind, kind)
        variants[name] = args.work / kind
    for spec in args.extra:
        name, _, path = spec.partition("=")
        variants[name] = Path(path)
    print(f"offsets int8: largest relative error of an offset {errors['offsets int8']:.2e}", flush=True)
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


if __name__ == "__main__":
    raise SystemExit(main())
