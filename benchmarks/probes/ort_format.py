"""The same bundle as ONNX graphs and as ORT-format graphs (``edge-spec package``): tokens, sizes, load, memory.

    python benchmarks/probes/ort_format.py [--bundle demo] [--prompts 20] [--tokens 32] [--threads 1] [--loads 3]
                                    [--work DIR] [--out results/ort_format.json]

Copies the bundle (the original is never touched), packages the copy for ONNX Runtime Mobile, then, for each
format, in fresh processes: the greedy tokens of ``--prompts`` chat prompts (benchmarks/lib/prompts.py, the
model's chat template) x ``--tokens`` new tokens, plain decoding and speculative; the first-step logits of each
prompt; ``Engine.load``'s wall time (the minimum over ``--loads`` processes) and the RSS it adds and its peak
(VmHWM); the peak RSS of the whole run; bytes on disk. Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.lib.prompts import CHAT_PROMPTS, chat_messages  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
from edge_spec import Engine
from edge_spec.runtime.memory import current_rss, peak_rss
bundle, threads, n, tokens, load_only = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
prompts = json.loads(sys.stdin.read())
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = current_rss()
t0 = time.perf_counter()
engine = Engine.load(bundle, threads=threads, spin=False, max_context=512)
out = {"load_seconds": time.perf_counter() - t0, "load_rss": current_rss() - before, "load_peak": peak_rss() - before,
       "mode": engine.plan.mode}
if load_only == "0":
    ar, spec, first = [], [], []
    for messages in prompts[:n]:
        ids = engine.encode_chat(messages)
        ar.append(list(engine.generate(ids, max_new_tokens=tokens, speculative=False).token_ids))
        spec.append(list(engine.generate(ids, max_new_tokens=tokens).token_ids))
        engine.reset()
        t = engine.target
        t.rewind_to(0)
        for s in range(0, len(ids), t.max_rows):
            logits = t.forward(ids[s:s + t.max_rows])
        first.append(np.asarray(logits[-1], dtype=np.float32).tolist())
        t.rewind_to(0)
        engine.reset()
    out.update(ar=ar, speculative=spec, first=first, run_peak=peak_rss())
print(json.dumps(out))
"""


def _child(bundle: Path, args: argparse.Namespace, load_only: bool) -> dict:
    prompts = [chat_messages(p) for p in CHAT_PROMPTS[: args.prompts]]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(bundle), str(args.threads), str(args.prompts),
                           str(args.tokens), "1" if load_only else "0"], input=json.dumps(prompts),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"the run on {bundle} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _disk(root: Path) -> int:
    """Bytes of the bundle's files, each inode once (hard links are one file)."""
    seen, total = set(), 0
    for p in root.rglob("*"):
        st = p.stat()
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default="demo", help="an ONNX bundle, or 'demo' (default)")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loads", type=int, default=3, help="fresh processes timing Engine.load (the minimum is kept)")
    ap.add_argument("--work", type=Path, help="where the copy and its package go (default: a temp dir, removed)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import onnxruntime as ort

    from edge_spec.bundle import read_manifest
    from edge_spec.demo import resolve_bundle
    from edge_spec.export.mobile import package_bundle

    src = resolve_bundle(args.bundle)
    work = args.work or Path(tempfile.mkdtemp(prefix="ort-format-"))
    try:
        onnx_dir, ort_dir = work / "onnx", work / "ort"
        shutil.rmtree(work / "onnx", ignore_errors=True)
        if subprocess.run(["cp", "-a", str(src), str(onnx_dir)]).returncode != 0:  # -a keeps the hard links
            shutil.copytree(src, onnx_dir)
        t0 = time.perf_counter()
        manifest = package_bundle(onnx_dir, ort_dir, force=True)
        package_seconds = time.perf_counter() - t0
        runs = {}
        for name, root in (("onnx", onnx_dir), ("ort", ort_dir)):
            full = _child(root, args, load_only=False)
            loads = [full["load_seconds"]] + [_child(root, args, load_only=True)["load_seconds"]
                                              for _ in range(args.loads - 1)]
            full["load_seconds_min"] = min(loads)
            full["disk_bytes"] = _disk(root)
            runs[name] = full
            print(f"{name}: done", file=sys.stderr)
        a, b = runs["onnx"], runs["ort"]
        same_ar = sum(x == y for x, y in zip(a["ar"], b["ar"]))
        same_spec = sum(x == y for x, y in zip(b["ar"], b["speculative"]))
        dlogit = max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in zip(a["first"], b["first"]))
        for r in runs.values():
            del r["first"]
        report = {"date": time.strftime("%Y-%m-%d"), "onnxruntime": ort.__version__, "bundle": str(src),
                  "prompts": args.prompts, "tokens": args.tokens, "threads": args.threads,
                  "package_seconds": round(package_seconds, 1), "identical_greedy_onnx_vs_ort": same_ar,
                  "identical_speculative_vs_plain_ort": same_spec, "max_abs_dlogit_first_step": dlogit,
                  "graph_bytes": {"target": manifest.target.weight_bytes,
                                  "drafter": manifest.drafter.weight_bytes if manifest.drafter else 0},
                  "manifest": {name: {role: {k: getattr(spec, k) for k in ("load_bytes", "load_peak_bytes")}
                                      for role, spec in (("target", m.target), ("drafter", m.drafter)) if spec}
                               for name, m in (("onnx", read_manifest(onnx_dir)), ("ort", manifest))},
                  "runs": runs}
        mib = 1 << 20
        print(f"\n{args.prompts} chat prompts x {args.tokens} greedy tokens: .ort == .onnx on {same_ar}/"
              f"{args.prompts}; speculative == plain on the .ort bundle on {same_spec}/{args.prompts}; "
              f"max |first-step logit difference| {dlogit:g}; packaging took {package_seconds:.1f} s\n")
        print(f"| format | bundle on disk | Engine.load (min of {args.loads}) | RSS added by load | load peak | "
              "run peak RSS |")
        print("|---|---|---|---|---|---|")
        for name, r in runs.items():
            print(f"| {name} | {r['disk_bytes'] / mib:.1f} MiB | {r['load_seconds_min']:.2f} s | "
                  f"{r['load_rss'] / mib:.1f} MiB | {r['load_peak'] / mib:.1f} MiB | {r['run_peak'] / mib:.1f} MiB |")
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
        return 0 if same_ar == args.prompts else 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
