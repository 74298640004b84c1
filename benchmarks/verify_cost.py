"""What a target pass of k rows costs against one row: the price of verifying k - 1 drafts at once.

    python benchmarks/verify_cost.py --bundle demo [OTHER ...] [--threads 1] [--rows 1 2 3 4 5 6 8] [--past 150]
                                     [--profile] [--model drafter]

One pass of k new tokens after ``--past`` cached positions through the bundle's target graph (drafting off, the
runtime's own forward with its IO binding, and no runtime padding: a pass has exactly k rows, so a graph that pads
itself, export/invariance.py, shows what that costs), all row counts — and all bundles, when several are given —
interleaved so load on a shared machine hits them alike (with several bundles their thread pools do not
spin); min and median over the repeats, and each median against the first bundle's 1-row pass. ``--profile``
also runs ONNX Runtime's profiler and sums node time per op type (and per MatMulNBits kind) for each row count
(profiling inflates times).
``--model drafter`` times the bundles' drafter graphs instead (the drafter's step: what a draft costs).
For llama.cpp's equivalent: ``llama-bench -m FILE.gguf -t T -p 1,2,3,5,8 -n 0 -d 150`` (prompt batches of k tokens).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import edge_spec.runtime.session as session_mod  # noqa: E402
from edge_spec import Engine  # noqa: E402


def _profiled_options(prefix: str):
    plain = session_mod.session_options

    def options(threads: int = 0, spin: bool = False):
        so = plain(threads, spin)
        so.enable_profiling = True
        so.profile_file_prefix = prefix
        return so
    return options


GGML_NAMES = {12: "Q4_K", 14: "Q6_K", 8: "Q8_0", 6: "Q5_0", 3: "Q4_1"}


def node_kinds(graph: Path) -> dict[str, str]:
    """node name -> what it is, for the per-kind profile: matmuls by weight encoding (MatMulNBits bits / block:
    in a GGUF coder graph 4-bit/32 = Q4_K's codes, 8-bit/16 = Q6_K; their fp32 block-offset MatMuls = Q4_K's
    mins; GgufMatMul by GGUF type under --gguf-mode kquant), the LM head, the embedding lookup, attention, norms,
    and the rest."""
    import onnx

    out = {}
    for n in onnx.load(str(graph), load_external_data=False).graph.node:
        a = {x.name: x.i for x in n.attribute}
        if n.name.startswith("/lm_head") and n.op_type in ("MatMulNBits", "GgufMatMul"):
            kind = "LM head"
        elif n.op_type == "GgufMatMul":  # --gguf-mode kquant: the file's blocks on edge-spec's kernels
            kind = f"GgufMatMul {GGML_NAMES.get(a.get('ggml_type'), a.get('ggml_type'))}"
        elif n.op_type == "MatMulNBits":
            kind = f"MatMulNBits {a.get('bits')}-bit block {a.get('block_size')}"
        elif n.op_type == "MatMul":
            kind = "block offsets (fp32 MatMul)" if "/offsets/" in n.name else "MatMul fp32"
        elif n.op_type == "GroupQueryAttention":
            kind = "attention (GroupQueryAttention)"
        elif "LayerNormalization" in n.op_type:
            kind = "norms"
        elif n.name.startswith(("/embed", "embed")):
            kind = "embedding lookup"
        else:
            kind = "rest"
        out[n.name] = kind
    return out


def op_times(profile_file: str, order: list[tuple[int, int]], warm: int,
             kinds: dict[str, str] | None = None) -> dict[int, dict[str, float]]:
    """ms per pass by op type for each row count, from ONNX Runtime's profile (runs matched in order)."""
    events = json.loads(Path(profile_file).read_text())
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    skip = len(runs) - len(order)  # the session's own probe pass at load
    per: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    reps: collections.Counter = collections.Counter(r for i, r in order if i >= warm)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        k = bisect.bisect_right(runs, e["ts"]) - 1 - skip
        if not 0 <= k < len(order) or order[k][0] < warm:
            continue
        rows, op = order[k][1], e["args"]["op_name"]
        per[rows][op] += e["dur"]
        if kinds is not None:
            per[rows]["kind: " + kinds.get(e["name"][:-len("_kernel_time")], "rest")] += e["dur"]
        if op == "MatMulNBits":
            per[rows]["MatMulNBits " + re.sub(r"layers\.\d+", "layers.N", e["name"][:-len("_kernel_time")])] += e["dur"]
    return {r: {op: round(us / reps[r] / 1e3, 3) for op, us in c.most_common()} for r, c in per.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", nargs="+", default=["demo"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--past", type=int, default=150, help="cached positions before the pass")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--model", choices=("target", "drafter"), default="target", help="the graph to time")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "verify_cost.json")
    args = ap.parse_args(argv)
    warm = 3
    if args.profile:
        session_mod.session_options = _profiled_options(str(Path(tempfile.gettempdir()) / "verify_cost"))
    # several bundles in one process: their thread pools must not spin (a pool spinning after its pass slows the next
    # bundle's pass; measured: 1-row passes at 2 threads 1.5x their cost alone)
    spin = None if len(args.bundle) == 1 else False
    drafting = "none" if args.model == "target" else "model"
    engines = [Engine.load(b, threads=args.threads, spin=spin, drafting=drafting, max_context=4096)
               for b in args.bundle]
    models = [e.target if args.model == "target" else e.drafter for e in engines]
    for e in engines:
        e.target.min_rows = 1  # the graph's own cost: no runtime padding of old (batch_invariant_rows 2) bundles
    keys = [(b, r) for b in range(len(engines)) for r in args.rows]
    samples: dict[tuple[int, int], list[float]] = {k: [] for k in keys}
    order = []
    for i in range(args.repeats + warm):
        for b, r in keys:
            t = models[b]
            t.rewind_to(0)
            t.kv.length = args.past  # the cost does not depend on the cached values
            t0 = time.perf_counter()
            t.forward([42] * r)
            dt = time.perf_counter() - t0
            if b == 0:
                order.append((i, r))
            if i >= warm:
                samples[(b, r)].append(dt)
            t.rewind_to(0)
    base = statistics.median(samples[(0, args.rows[0])])
    rows = []
    for (b, r), v in samples.items():
        med = statistics.median(v)
        rows.append({"bundle": str(args.bundle[b]), "rows": r, "min_ms": round(min(v) * 1e3, 2),
                     "median_ms": round(med * 1e3, 2), "vs_first": round(med / base, 2)})
        print(f"{args.bundle[b]}: {r} rows: min {min(v) * 1e3:.2f} ms, median {med * 1e3:.2f} ms ({med / base:.2f}x)")
    report: dict = {"bundles": [str(b) for b in args.bundle], "model": args.model, "threads": args.threads,
                    "past": args.past, "passes": rows}
    if args.profile:
        spec = engines[0].manifest.target if args.model == "target" else engines[0].manifest.drafter
        kinds = node_kinds(Path(engines[0].bundle_dir) / spec.graph)
        report["op_ms_per_pass"] = op_times(models[0].session.end_profiling(), order, warm, kinds)
        for r, ops in report["op_ms_per_pass"].items():
            print(f"-- {r} rows: " + ", ".join(f"{k} {v}" for k, v in list(ops.items())[:8]))
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
