"""``edge-spec bench``: autoregressive vs speculative decoding on one bundle, with a report and plots.

Every number compares runs made in the same process, interleaved (AR, speculative, AR, ...), so
machine drift hits both sides. Outputs are fixed-length (stop tokens ignored) so both sides
decode the same number of tokens. A memory-budget sweep runs each budget in a fresh
subprocess because peak RSS is a per-process quantity.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from edge_spec.cli import common
from edge_spec.cli.bench_report import SAMPLINGS, SPREAD_NOTE, plots, report, sweep_table, table
from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.memory import peak_rss

MiB = common.MiB
BUILTIN_PROMPTS = (
    ("code", "def fibonacci(n):\n"),
    ("code", "import os\n\n\ndef list_python_files(root):\n"),
    ("code", "class Stack:\n    def __init__(self):\n"),
    ("docstring", 'def is_palindrome(text):\n    """Return True if text reads the same backwards."""\n'),
    ("docstring", 'def word_counts(path):\n    """Count how often each word occurs in the file at path."""\n'),
    ("docstring", 'def chunks(items, size):\n    """Split items into lists of at most size elements."""\n'),
    ("chat", "Write a Python function that reverses a string."),
    ("chat", "How do I read a JSON file in Python?"),
    ("chat", "Write a function that returns the largest of three numbers."),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = common.command_parser(
        subparsers, "bench", help="compare autoregressive and speculative decoding; report + plots",
        description="Measure tokens/s of plain autoregressive decoding against speculative decoding (greedy and "
                    "sampled at T=0.7) on a built-in prompt set (code completion, docstring->code, chat) or your "
                    "own, plus acceptance, mean accepted length, draft-length histogram and peak RSS. Prints a "
                    "table and writes report.md, results.json and plots into --out.\n\n"
                    "--prompts FILE: one prompt per line, optionally 'category<TAB>prompt'; \\n and \\t in a "
                    "prompt are newline and tab; a category starting with 'chat' is sent as a user message; "
                    "lines starting with # are skipped.",
        examples="""
  edge-spec bench bundles/qwen
  edge-spec bench bundles/qwen --prompts my_prompts.tsv --repeats 5 --max-new-tokens 256 --out results/qwen
  edge-spec bench bundles/qwen --budget-sweep                  # auto: planner's lower bound .. no limit
  edge-spec bench bundles/qwen --budget-sweep 150MB,200MB,400MB --repeats 1""")
    p.add_argument("bundle", metavar="BUNDLE", help=common.BUNDLE_HELP)
    p.add_argument("--prompts", metavar="FILE", help="prompt file (default: the built-in set)")
    p.add_argument("--out", default="edge-spec-bench", metavar="DIR", help="report directory (default %(default)s)")
    p.add_argument("--repeats", type=common.positive_int, default=3, metavar="N", help="runs per prompt (default 3)")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=128, metavar="N",
                   help="tokens per run (default 128)")
    p.add_argument("--draft-length", type=common.positive_int, metavar="G",
                   help="fixed draft length (default: adaptive, as the engine runs by default)")
    p.add_argument("--budget-sweep", nargs="?", const="auto", metavar="SIZES|auto",
                   help="also measure throughput and peak RSS per memory budget, each in a fresh process: "
                        "comma-separated sizes, or auto (the planner's lower bound up to no limit)")
    p.add_argument("--sweep-points", type=common.positive_int, default=6, metavar="N",
                   help="budgets in an auto sweep (default 6)")
    common.add_load_options(p)
    p.set_defaults(run=run)


# ------------------------------------------------------------------------------ command
def run(args: argparse.Namespace) -> int:
    from edge_spec.runtime.budget import parse_budget

    prompts = _read_prompts(args.prompts) if args.prompts else list(BUILTIN_PROMPTS)
    sweep = None
    if args.budget_sweep and args.budget_sweep != "auto":
        sweep = [parse_budget(s.strip()) for s in args.budget_sweep.split(",") if s.strip()]
        if not sweep:
            raise EdgeSpecError("--budget-sweep needs sizes like 150MB,300MB, or 'auto'.")
    out = Path(args.out)
    err = common.Console(sys.stderr)
    args.bundle = str(common.bundle_path(args.bundle))  # 'demo' -> its directory, for the sweep's workers too
    engine = common.load_engine(args, args.bundle)  # a bad bundle fails here, before anything is written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"Cannot create the report directory '{out}' ({exc.strerror}); choose another --out.") \
            from None
    plot = _matplotlib()
    records = measure(engine, prompts, args.repeats, args.max_new_tokens, args.draft_length,
                      say=lambda msg: err.line(err.dim(f"edge-spec bench: {msg}")))
    rows = summarize(records, prompts)
    peak = peak_rss()
    common.Console(sys.stdout).line(table(rows) + f"\n{SPREAD_NOTE.format(n=args.repeats)}\npeak RSS "
                                                  f"{common.mib(peak)} (planned {common.mib(engine.plan.total_bytes)})")
    points = None
    if args.budget_sweep:
        points = budget_sweep(args, prompts, sweep, say=lambda msg: err.line(err.dim(f"edge-spec bench: {msg}")))
        common.Console(sys.stdout).line(sweep_table(points))
    results = {"bundle": str(args.bundle), "plan": engine.plan.describe(), "settings": _settings(args, prompts),
               "peak_rss_bytes": peak, "rows": rows, "records": records, "sweep": points}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    images = plot(out, rows, points) if plot else []
    (out / "report.md").write_text(report(results, images, plot is not None), encoding="utf-8")
    print(f"Wrote {out / 'report.md'}" + "".join(f", {out / i}" for i in images) + f", {out / 'results.json'}.")
    return 0


def _read_prompts(path: str) -> list[tuple[str, str]]:
    prompts = []
    for line in common.read_text(path, "prompts").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cat, _, text = line.partition("\t") if "\t" in line else ("prompts", "", line)
        if not text.strip():
            raise EdgeSpecError(f"The prompts file '{path}' has an empty prompt after category '{cat}'.")
        prompts.append((cat.strip() or "prompts", common.unescape(text)))
    if not prompts:
        raise EdgeSpecError(f"The prompts file '{path}' has no prompts; write one per line.")
    return prompts


def _matplotlib() -> Any:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:  # imported only after measuring: it would inflate RSS
        print("edge-spec bench: matplotlib is not installed, so no plots are drawn; pip install 'edge-spec[bench]' "
              "(or matplotlib) to get them.", file=sys.stderr)
        return None
    return plots


def _settings(args: argparse.Namespace, prompts: list[tuple[str, str]]) -> dict[str, Any]:
    return {"prompts": args.prompts or "built-in", "n_prompts": len(prompts), "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length or "adaptive",
            "memory_budget": args.memory_budget, "device": args.device, "drafter_device": args.drafter_device,
            "threads": args.threads, "spin": args.spin, "drafter_threads": args.drafter_threads}


# ------------------------------------------------------------------------------ measuring
def _prompt_text(engine: Any, category: str, text: str) -> str | list[int]:
    if category.startswith("chat") and engine.manifest.tokenizer.chat is not None:  # the template's exact ids
        return engine.encode_chat([{"role": "user", "content": text}])
    return text


def measure(engine: Any, prompts: list[tuple[str, str]], repeats: int, max_new: int, draft_length: int | None,
            samplings=SAMPLINGS, modes=("ar", "speculative"), say=lambda _msg: None) -> list[dict[str, Any]]:
    """One record per (prompt, sampling, repeat, mode); the engine is reset before each run."""
    from edge_spec.runtime.config import GenerationConfig

    def once(text: str, temperature: float, seed: int, mode: str, n: int):
        engine.reset()  # no KV reuse between runs: each run prefills its prompt
        cfg = GenerationConfig(max_new_tokens=n, temperature=temperature, seed=seed, stop_token_ids=(),
                               speculative=mode == "speculative", draft_length=draft_length)
        return engine.generate(text, cfg).stats

    texts = [_prompt_text(engine, c, t) for c, t in prompts]
    # Warm-up, not recorded: ORT's first-call allocations and the adaptive policy's step-cost estimates
    # (a cold policy probes several draft lengths), so that repeat 0 is not slower than the rest.
    for mode in modes:
        for text in texts[:2]:
            once(text, 0.0, 0, mode, min(64, max_new))
    records = []
    for i, ((category, _), text) in enumerate(zip(prompts, texts)):
        say(f"prompt {i + 1}/{len(prompts)} ({category})")
        for sampling, temperature in samplings:
            for r in range(repeats):
                for mode in modes:
                    st = once(text, temperature, r, mode, max_new)
                    records.append({"prompt": i, "category": category, "sampling": sampling, "mode": mode,
                                    "repeat": r, "tokens": st.tokens, "seconds": st.seconds,
                                    "target_passes": st.target_passes, "drafted": st.drafted,
                                    "accepted": st.accepted, "gamma_hist": dict(st.gamma_hist)})
    return records


def _agg(recs: list[dict[str, Any]]) -> dict[str, float]:
    tokens = sum(r["tokens"] for r in recs)
    seconds = sum(r["seconds"] for r in recs)
    drafted, passes = sum(r["drafted"] for r in recs), sum(r["target_passes"] for r in recs)
    per_repeat = defaultdict(lambda: [0, 0.0])  # the spread: tok/s of each repeat over the same prompts
    for r in recs:
        per_repeat[r["repeat"]][0] += r["tokens"]
        per_repeat[r["repeat"]][1] += r["seconds"]
    tps = sorted(t / s for t, s in per_repeat.values() if s) or [0.0]
    return {"tokens_per_second": tokens / seconds if seconds else 0.0,
            "tps_median": tps[len(tps) // 2] if len(tps) % 2 else (tps[len(tps) // 2 - 1] + tps[len(tps) // 2]) / 2,
            "tps_min": tps[0], "tps_max": tps[-1],
            "acceptance": sum(r["accepted"] for r in recs) / drafted if drafted else 0.0,
            "tokens_per_pass": tokens / passes if passes else 0.0}


def summarize(records: list[dict[str, Any]], prompts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Rows per (category, sampling), then 'all'; speedup = speculative tok/s / AR tok/s over the same runs."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["category"], r["sampling"])].append(r)
        groups[("all", r["sampling"])].append(r)
    rows = []
    categories = list(dict.fromkeys(c for c, _ in prompts)) + ["all"]
    for cat in categories:
        for sampling, _ in SAMPLINGS:
            recs = groups.get((cat, sampling), [])
            ar = _agg([r for r in recs if r["mode"] == "ar"])
            sd_recs = [r for r in recs if r["mode"] == "speculative"]
            sd = _agg(sd_recs)
            hist: Counter = Counter()
            for r in sd_recs:
                hist.update({int(g): n for g, n in r["gamma_hist"].items()})
            rows.append({"category": cat, "sampling": sampling, "ar_tps": ar["tokens_per_second"],
                         "sd_tps": sd["tokens_per_second"], "ar_range": (ar["tps_min"], ar["tps_max"]),
                         "sd_range": (sd["tps_min"], sd["tps_max"]),
                         "speedup": sd["tokens_per_second"] / ar["tokens_per_second"] if ar["tokens_per_second"]
                         else 0.0,
                         "acceptance": sd["acceptance"], "tokens_per_pass": sd["tokens_per_pass"],
                         "gamma_hist": dict(sorted(hist.items()))})
    return rows


# ------------------------------------------------------------------------------ budget sweep
def budget_sweep(args: argparse.Namespace, prompts: list[tuple[str, str]], budgets: list[int] | None,
                 say=lambda _msg: None) -> list[dict[str, Any]]:
    base = {"bundle": str(args.bundle), "device": args.device, "drafter_device": args.drafter_device,
            "threads": args.threads, "spin": args.spin, "drafter_threads": args.drafter_threads}
    if budgets is None:
        probe = _subprocess({**base, "probe": True})
        lo, hi = probe["lower_bound"], probe["unbounded"]
        n = args.sweep_points
        budgets = sorted({int(lo * 1.03 + (hi * 1.05 - lo * 1.03) * i / max(n - 1, 1)) for i in range(n)})
        say(f"auto sweep: planner lower bound {common.mib(lo)}, unlimited plan {common.mib(hi)}")
    points = []
    for i, b in enumerate(budgets):
        say(f"budget {i + 1}/{len(budgets)}: {common.mib(b)} (fresh process)")
        points.append(_subprocess({**base, "budget": b, "prompts": prompts, "repeats": args.repeats,
                                   "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length}))
    return points


def _subprocess(job: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "edge_spec.cli.bench_cmd", "--worker", json.dumps(job)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgeSpecError(f"A budget-sweep subprocess failed ({last.rstrip('.')}).")
    return json.loads(lines[-1])


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh process: plan (probe) or measure one budget point."""
    from edge_spec.runtime.engine import Engine

    if job.get("probe"):
        return _probe(job["bundle"])
    budget = job["budget"]
    try:
        engine = Engine.load(job["bundle"], memory_budget=budget, device=job["device"],
                             drafter_device=job["drafter_device"], threads=job["threads"], spin=job["spin"],
                             drafter_threads=job.get("drafter_threads"))
        recs = measure(engine, [tuple(p) for p in job["prompts"]], job["repeats"], job["max_new_tokens"],
                       job["draft_length"], samplings=(SAMPLINGS[0],), modes=("speculative",))
    except EdgeSpecError as exc:  # refused by the planner, or a prompt longer than the planned context
        return {"budget": budget, "ok": False, "error": str(exc), "peak_rss": peak_rss()}
    agg = _agg(recs)
    plan = engine.plan
    return {"budget": budget, "ok": True, "mode": plan.mode, "max_context": plan.max_context,
            "draft_length": plan.draft_length, "planned": plan.total_bytes, "peak_rss": peak_rss(), **agg}


def _probe(bundle: str) -> dict[str, Any]:
    """The planner's smallest workable budget and the unlimited plan, with this fresh process's baseline."""
    from tokenizers import Tokenizer

    from edge_spec.bundle import read_manifest
    from edge_spec.errors import BudgetError
    from edge_spec.runtime.budget import plan_memory
    from edge_spec.runtime.memory import current_rss

    m = read_manifest(bundle)
    Tokenizer.from_file(str(Path(bundle) / m.tokenizer.files[0]))
    baseline = current_rss()
    hi = plan_memory(m, None, baseline).total_bytes
    lo, top = 1, hi
    while lo < top:  # smallest budget that plans: bisect on the planner itself, no formula duplicated
        mid = (lo + top) // 2
        try:
            plan_memory(m, mid, baseline)
            top = mid
        except BudgetError:
            lo = mid + 1
    return {"lower_bound": lo, "unbounded": hi, "baseline": baseline}


if __name__ == "__main__":  # the budget-sweep worker: python -m edge_spec.cli.bench_cmd --worker JSON
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(json.loads(sys.argv[2]))))
    else:
        raise SystemExit("usage: python -m edge_spec.cli.bench_cmd --worker JSON (internal; use edge-spec bench)")
