"""Runtime benchmark on one bundle, all ratios measured in the same run.

    python benchmarks/probes/bench_runtime.py BUNDLE [--tokens 128] [--budget 300MB] [--json out.json]

Reports AR tok/s, speculative tok/s (greedy adaptive, greedy fixed gamma, T=0.7), acceptance,
mean accepted length (tokens per target pass), the share of wall time spent outside ONNX
Runtime (Python loop + sampling + detokenization) and peak RSS against the plan / budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_spec import Engine  # noqa: E402
from edge_spec.runtime.config import Stats  # noqa: E402
from edge_spec.runtime.memory import peak_rss  # noqa: E402

FALLBACK_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\nimport sys\n\n\ndef walk_files(root, suffix):\n",
    "<|user|>\nConvert a string of hexadecimal digits to bytes.<|end|>\n<|assistant|>\n",
    "<|user|>\nRemove duplicate entries from a list while keeping their order.<|end|>\n<|assistant|>\n",
]


def _prompts() -> list[str]:
    try:
        from benchmarks.lib.prompts import prompts  # the shared benchmark prompts, when present

        return [text for _, text in prompts()]
    except Exception:
        return FALLBACK_PROMPTS


def run_mode(engine: Engine, prompts: list[str], tokens: int, **gen) -> Stats:
    total = Stats()
    for p in prompts:
        engine.reset()  # every mode prefills every prompt: same work, comparable numbers
        engine.generate(p, max_new_tokens=tokens, **gen)
        total.add(engine.last_stats)
    return total


def run_interleaved(engine: Engine, prompts: list[str], tokens: int, modes: dict[str, dict],
                    repeats: int) -> dict[str, Stats]:
    """Every mode on every prompt, modes interleaved, so background load drifts hit all modes alike."""
    out = {name: Stats() for name in modes}
    for _ in range(repeats):
        for p in prompts:
            for name, gen in modes.items():
                out[name].add(run_mode(engine, [p], tokens, **gen))
    return out


def self_draft_bundle(bundle: Path) -> Path:
    """A view of ``bundle`` whose drafter is the target itself: acceptance 1 in greedy mode, so the
    row shows the loop's ceiling (and catches a loop that rejects what it should accept)."""
    import dataclasses
    import tempfile

    from edge_spec.bundle import read_manifest, write_manifest

    m = read_manifest(bundle)
    tmp = Path(tempfile.mkdtemp(prefix="self_draft_"))
    for rel in {Path(f).parts[0] for f in (m.target.graph, *m.target.data_files, *m.tokenizer.files)}:
        (tmp / rel).symlink_to(Path(bundle).resolve() / rel)
    write_manifest(tmp, dataclasses.replace(m, drafter=m.target, vocab_trim=None))
    return tmp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--budget", default=None, help="memory budget, e.g. 300MB")
    ap.add_argument("--gamma", type=int, default=4, help="draft length of the fixed-gamma row")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--self-draft", action="store_true", help="add rows with the target as its own drafter")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    engine = Engine.load(args.bundle, memory_budget=args.budget, threads=args.threads)
    load_s = time.perf_counter() - t0
    prompts = _prompts()
    run_mode(engine, prompts[:1], 16, speculative=False)  # warm up kernels and caches
    run_mode(engine, prompts[:1], 16, draft_length=args.gamma)

    modes = {
        "AR greedy": dict(speculative=False),
        "SD greedy (adaptive)": dict(),
        f"SD greedy (gamma={args.gamma})": dict(draft_length=args.gamma),
        "AR T=0.7": dict(speculative=False, temperature=0.7, seed=0),
        "SD T=0.7 (adaptive)": dict(temperature=0.7, seed=0),
        f"SD T=0.7 (gamma={args.gamma})": dict(temperature=0.7, seed=0, draft_length=args.gamma),
    }
    stats = run_interleaved(engine, prompts, args.tokens, modes, args.repeats)
    peak = peak_rss()  # before a second engine (self-draft) shares the process
    if args.self_draft:
        twin = Engine.load(self_draft_bundle(Path(args.bundle)), threads=args.threads)
        stats.update(run_interleaved(twin, prompts, args.tokens, {
            f"self-draft greedy (gamma={args.gamma})": dict(draft_length=args.gamma),
            "self-draft T=0.7 (adaptive)": dict(temperature=0.7, seed=0)}, args.repeats))
    rows = {}
    for name, s in stats.items():
        rows[name] = {"tok_s": s.tokens_per_second, "acceptance": s.acceptance_rate,
                      "tokens_per_target_pass": s.mean_accepted_length, "overhead_share": s.overhead_share,
                      "target_s": s.target_seconds, "drafter_s": s.drafter_seconds, "seconds": s.seconds,
                      "tokens": s.tokens, "gamma_hist": dict(sorted(s.gamma_hist.items()))}
    ar = rows["AR greedy"]["tok_s"]
    ar7 = rows["AR T=0.7"]["tok_s"]
    for name, r in rows.items():
        r["speedup_vs_ar"] = r["tok_s"] / (ar7 if "T=0.7" in name else ar)
    result = {
        "bundle": str(args.bundle), "plan": engine.plan.describe(), "load_s": load_s, "prompts": len(prompts),
        "tokens_per_prompt": args.tokens, "modes": rows, "peak_rss_bytes": peak,
        "planned_bytes": engine.plan.total_bytes, "budget_bytes": engine.plan.budget_bytes,
        "within_budget": None if engine.plan.budget_bytes is None else peak <= engine.plan.budget_bytes,
    }
    print(engine.plan.describe())
    print(f"\n{'mode':<26}{'tok/s':>8}{'x AR':>7}{'accept':>8}{'tok/pass':>9}{'overhead':>10}  gamma histogram")
    for name, r in rows.items():
        print(f"{name:<26}{r['tok_s']:8.1f}{r['speedup_vs_ar']:7.2f}{r['acceptance']:8.2f}"
              f"{r['tokens_per_target_pass']:9.2f}{r['overhead_share']:10.1%}  {r['gamma_hist']}")
    budget = "none" if engine.plan.budget_bytes is None else f"{engine.plan.budget_bytes / 2**20:.1f} MiB"
    print(f"\npeak RSS {peak / 2**20:.1f} MiB; planned {engine.plan.total_bytes / 2**20:.1f} MiB; budget {budget}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
