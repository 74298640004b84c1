"""Rerun every edge-spec benchmark with one command and write results, plots and a Markdown table.

    python benchmarks/run_all.py            # full run (tens of minutes on 2 cores)
    python benchmarks/run_all.py --quick    # smoke test: 2 prompts, 1 repeat, short outputs

Steps (all outputs that are models go to ``--work``, default benchmarks/out/, gitignored):
1. the bench target: the demo target grown to SmolLM-135M shapes with the same function
   (lib/bench_target.py), rebuilt whenever the demo target's weights change;
2. exports: edge-spec bundles of (demo target, demo drafter) and (bench target, demo drafter),
   each with and without the trimmed drafter vocabulary, through
   ``edge_spec.export.pipeline.export_bundle``; when the exporter is missing, plain model-builder
   exports stand in for the peers (same builder, same int4 settings);
3. memory bandwidth and the autoregressive ceiling it implies (lib/bandwidth.py);
4. every system on the same prompts (lib/prompts.py), each in its own process (lib/measure.py):
   edge-spec AR / speculative, greedy and T=0.7, trimmed and untrimmed drafter (lib/edge.py);
   ORT GenAI AR and its speculative mode on the same graphs, transformers AR and assisted
   generation on the same HF weights (lib/genai.py, lib/hf.py);
5. an edge-spec memory-budget sweep on the bench pair, next to ORT GenAI's own peak RSS;
6. results JSON + PNGs + the Markdown table into benchmarks/results/ (latest.* or quick.*; lib/report.py).
The bench target's last run and what it showed: docs/journal/2026-11.md ("Results").
Ratios are always computed between systems measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.lib import bandwidth, edge, genai, report  # noqa: E402
from benchmarks.lib.measure import measure  # noqa: E402
from benchmarks.lib.prompts import prompts as bench_prompts  # noqa: E402

DEMO_TARGET, DEMO_DRAFTER = ROOT / "models/demo/target", ROOT / "models/demo/drafter"
TARGET_ACCURACY_LEVEL = 1  # what edge-spec export uses for targets (exact k-token verify); peers get the same


def log(msg: str) -> None:
    print(f"[run_all {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def dir_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and (f.suffix == ".safetensors" or f.name == "config.json"):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def cached(out: Path, key: str) -> bool:
    return (out / ".bench_key").is_file() and (out / ".bench_key").read_text() == key


def mark(out: Path, key: str) -> None:
    (out / ".bench_key").write_text(key)


# ------------------------------------------------------------------------------ models and exports
def ensure_bench_checkpoint(work: Path) -> Path:
    from benchmarks.lib import bench_target as make_bench_target

    out = work / "bench_target"
    key = dir_hash(DEMO_TARGET) + "-" + hashlib.sha256((HERE / "lib" / "bench_target.py").read_bytes()).hexdigest()[:8]
    if not cached(out, key):
        log("building the bench target from the demo target (lib/bench_target.py --check)")
        make_bench_target.grow(DEMO_TARGET, out)
        (out / "CHECK.json").write_text(json.dumps(make_bench_target.check(DEMO_TARGET, out), indent=2) + "\n")
        mark(out, key)
    return out


def builder_export(hf_dir: Path, out: Path, accuracy_level: int | None) -> Path:
    key = dir_hash(hf_dir) + f"-acc{accuracy_level}"
    if cached(out, key):
        return out
    log(f"model builder: {hf_dir.name} -> {out.name} (int4, accuracy_level {accuracy_level})")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
           "-p", "int4", "-e", "cpu", "-c", str(out.parent / ("cache_" + out.name))]
    if accuracy_level is not None:
        cmd += ["--extra_options", f"int4_accuracy_level={accuracy_level}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"model builder failed for {hf_dir}: {proc.stderr.strip().splitlines()[-1:]}")
    mark(out, key)
    return out


TARGET_QUANT = "int4:1"  # the exporter's default for the target; --target-quant changes it


def export_bundles(target: Path, name: str, work: Path, drafter: Path = DEMO_DRAFTER,
                   variants: tuple[tuple[str, str | None], ...] = (("trimmed", "auto"), ("untrimmed", None)),
                   ) -> dict[str, Path] | str:
    """{'trimmed': path, 'untrimmed': path}, or the reason edge-spec export is unavailable."""
    try:
        from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle
    except Exception as exc:
        return f"edge-spec export not available ({exc.__class__.__name__}: {exc})"
    out: dict[str, Path] = {}
    for variant, trim in variants:
        path = work / "bundles" / f"{name}-{variant}-{TARGET_QUANT.replace(':', '_')}"
        key = dir_hash(target) + "-" + dir_hash(drafter) + f"-{trim}-{TARGET_QUANT}"
        if not cached(path, key):
            log(f"edge-spec export: {name} ({variant} drafter)")
            try:
                options = ExportOptions(trim_vocab=trim, force=True, target_quant=Quant.parse(TARGET_QUANT, "target"))
                export_bundle(str(target), str(drafter), path, options, progress=None)
            except Exception as exc:
                return f"edge-spec export failed for {name}/{variant} ({exc.__class__.__name__}: {exc})"
            mark(path, key)
        out[variant] = path
    return out


def peer_dirs(pair: str, target_hf: Path, work: Path, bundles: dict[str, Path] | str,
              gammas: list[int]) -> dict[str, Any]:
    """ORT GenAI model dirs: the bundle's own graphs when there are bundles, else builder exports."""
    if isinstance(bundles, dict):
        target_dir = bundles["untrimmed"] / "target"
        manifest = json.loads((bundles["untrimmed"] / "edge_spec.json").read_text())
        d = manifest["drafter"]
        block = copy.deepcopy(json.loads((target_dir / "genai_config.json").read_text())["model"]["decoder"])
        block.update(filename=Path(d["graph"]).name, num_hidden_layers=d["num_layers"], head_size=d["head_size"],
                     num_attention_heads=d["num_attention_heads"], num_key_value_heads=d["num_kv_heads"],
                     hidden_size=d["hidden_size"])
        draft_dir, source = bundles["untrimmed"] / Path(d["graph"]).parent, "edge-spec bundle graphs"
    else:
        target_dir = builder_export(target_hf, work / "builder" / f"{pair}_target", TARGET_ACCURACY_LEVEL)
        draft_dir = builder_export(DEMO_DRAFTER, work / "builder" / "demo_drafter", 4)
        block, source = None, "model builder exports (int4; target accuracy_level 1, drafter 4)"
    comps = {k: genai.ort_composite(target_dir, draft_dir, work / "composite" / f"{pair}_k{k}", k, block)
             for k in gammas}
    return {"target": target_dir, "composites": comps, "source": source}


# ------------------------------------------------------------------------------ systems
def run_pair(pair: str, target_hf: Path, work: Path, args: argparse.Namespace, ids: list[list[int]],
             edge_reason: str | None) -> dict[str, Any]:
    bundles = export_bundles(target_hf, pair, work) if not edge_reason else edge_reason
    dirs = peer_dirs(pair, target_hf, work, bundles, args.gammas)
    base = {"prompt_ids": ids, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "warmup": 1, "threads": args.threads, "seed": 1234}
    res: dict[str, Any] = {"peer_graphs": dirs["source"], "systems": {}}
    if isinstance(bundles, str):
        res["edge_spec_skipped"] = bundles
    systems = res["systems"]

    def run(name: str, spec: dict[str, Any]) -> None:
        log(f"{pair}: {name}")
        systems[name] = measure({**base, **spec})
        r = systems[name]
        msg = r.get("error") or r.get("refused") or f"{r.get('tokens_per_s', 0):.1f} tok/s"
        log(f"{pair}: {name}: {msg}")

    ort = {"module": "genai", "system": "ort_genai"}
    for temp in (0.0, 0.7):
        t = f"T={temp:g}"
        # ORT GenAI with its defaults, and with intra-op spinning off (what edge-spec's sessions use; much
        # faster on a busy 2-core machine): the comparisons use whichever is faster.
        for spin, tag in ((False, ""), (True, "nospin ")):
            run(f"ort_genai_ar {tag}{t}", {**ort, "model": str(dirs["target"]), "temperature": temp, "no_spin": spin})
        ks = args.gammas if temp == 0 else [best_k(systems, args.gammas)]
        for k in ks:
            run(f"ort_genai_spec nospin k={k} {t}", {**ort, "k": k, "temperature": temp, "no_spin": True,
                                                    "model": str(dirs["composites"][k])})
        k = best_k(systems, args.gammas)
        run(f"ort_genai_spec k={k} {t}", {**ort, "k": k, "temperature": temp, "model": str(dirs["composites"][k])})
        if isinstance(bundles, dict):
            for variant in ("trimmed", "untrimmed"):
                run(f"edge_spec_sd {variant} {t}", {"module": "edge", "bundle": str(bundles[variant]),
                                                   "speculative": True, "temperature": temp})
            if temp == 0:  # a fixed draft length, so the theory has one gamma to compare with
                run(f"edge_spec_sd trimmed gamma={args.fixed_gamma} {t}",
                    {"module": "edge", "bundle": str(bundles["trimmed"]), "speculative": True, "temperature": temp,
                     "gamma": args.fixed_gamma})
            run(f"edge_spec_ar {t}", {"module": "edge", "bundle": str(bundles["trimmed"]), "speculative": False,
                                      "temperature": temp})
    if not args.skip_hf and not (args.quick and pair == "bench"):
        # OpenMP threads sleep instead of spinning, like the ORT sessions with spinning off
        hf = {"module": "hf", "system": "hf", "model": str(target_hf), "env": {"OMP_WAIT_POLICY": "PASSIVE"},
              "repeats": min(args.repeats, args.hf_repeats)}
        run("hf_ar T=0", hf)
        run("hf_assisted T=0", {**hf, "draft": str(DEMO_DRAFTER)})
    if pair == "bench" and isinstance(bundles, dict) and args.oracle_drafter:
        res["oracle"] = oracle_drafter(target_hf, work, base, args)
    if pair == "bench" and isinstance(bundles, dict) and not args.skip_sweep:
        res["budget_sweep"] = budget_sweep(bundles["trimmed"], base, args)
    res["sizes"] = bandwidth.model_bytes_from_dir(Path(dirs["target"]))
    return res


def oracle_drafter(target_hf: Path, work: Path, base: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Bench target drafted by the *demo target*: the same function, so greedy acceptance is ~1.

    Separates the loop's efficiency from the drafter's quality: with α ≈ 1 the speedup is bounded
    only by c and by what a (γ+1)-token verify pass costs. Both edge-spec and ORT GenAI run it."""
    bundles = export_bundles(target_hf, "bench-oracle", work, drafter=DEMO_TARGET, variants=(("untrimmed", None),))
    if isinstance(bundles, str):
        return {"skipped": bundles}
    dirs = peer_dirs("bench-oracle", target_hf, work, bundles, args.gammas)
    out: dict[str, Any] = {}
    for k in args.gammas:
        name = f"ort_genai_spec nospin k={k} T=0"
        log(f"oracle drafter: {name}")
        out[name] = measure({**base, "module": "genai", "system": "ort_genai", "k": k, "no_spin": True,
                             "model": str(dirs["composites"][k])})
    for gamma in (None, *args.gammas):
        name = "edge_spec_sd T=0" if gamma is None else f"edge_spec_sd gamma={gamma} T=0"
        log(f"oracle drafter: {name}")
        out[name] = measure({**base, "module": "edge", "bundle": str(bundles["untrimmed"]), "speculative": True,
                             "temperature": 0.0, "gamma": gamma})
    return out


def best_k(systems: dict[str, Any], gammas: list[int]) -> int:
    scored = [(systems.get(f"ort_genai_spec nospin k={k} T=0", {}).get("tokens_per_s") or 0, k) for k in gammas]
    return max(scored)[1]


def budget_sweep(bundle: Path, base: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """edge-spec SD (greedy) at shrinking budgets until the planner refuses; each point in its own process."""
    spec = {**base, "module": "edge", "bundle": str(bundle), "speculative": True, "temperature": 0.0,
            "repeats": 1, "prompt_ids": base["prompt_ids"][:2]}
    free = measure({**spec, "budget": None})
    points = [{"budget": None, **_point(free)}]
    if "error" in free:
        return points
    budget = int(free["peak_rss"] * 1.25)
    for _ in range(args.sweep_points):
        log(f"budget sweep: {budget / 2**20:.0f} MiB")
        r = measure({**spec, "budget": budget})
        points.append({"budget": budget, **_point(r)})
        if "refused" in r or "error" in r:
            break
        budget = int(budget * args.sweep_factor)
    return points


def _point(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("tokens_per_s", "peak_rss", "rss_baseline", "rss_after_load", "acceptance", "tokens_per_target_pass",
            "gamma", "plan", "refused", "error")
    return {k: r[k] for k in keep if k in r}


# ------------------------------------------------------------------------------ main
def environment(args: argparse.Namespace) -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for pkg in ("onnxruntime", "onnxruntime-genai", "transformers", "torch", "numpy", "edge-spec"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    import os

    return {"command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(ROOT)
                                                   if Path(sys.argv[0]).is_absolute() else sys.argv[0])]
                                                 + sys.argv[1:]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "versions": versions, "python": platform.python_version(), "cpu": cpu, "cores": os.cpu_count(),
            "load_average_at_start": os.getloadavg(), "git": git.stdout.strip(),
            "model_hashes": {"demo_target": dir_hash(DEMO_TARGET), "demo_drafter": dir_hash(DEMO_DRAFTER)},
            "settings": {k: v for k, v in vars(args).items() if k not in ("work", "results")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 prompts, 1 repeat, 32 tokens, demo+bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads for every system (torch too)")
    ap.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6, 8], help="ORT GenAI max_draft_tokens tried")
    ap.add_argument("--fixed-gamma", type=int, default=4, help="edge-spec SD run with a fixed draft length too")
    ap.add_argument("--pairs", nargs="+", default=["demo", "bench"], choices=["demo", "bench"])
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--target-quant", default="int4:1",
                    help="target precision[:accuracy_level] of the edge-spec bundles (exporter default int4:1)")
    ap.add_argument("--hf-repeats", type=int, default=1, help="repeats for transformers (slow on CPU)")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--oracle-drafter", action="store_true",
                    help="also draft the bench target with the demo target (same function, acceptance ~1)")
    ap.add_argument("--sweep-points", type=int, default=8)
    ap.add_argument("--sweep-factor", type=float, default=0.85)
    ap.add_argument("--work", type=Path, default=HERE / "out")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    global TARGET_QUANT
    TARGET_QUANT = args.target_quant
    if args.quick:
        args.repeats, args.max_new_tokens, args.gammas, args.sweep_points = 1, 32, [4], 3
    args.work.mkdir(parents=True, exist_ok=True)
    env = environment(args)
    log(f"{env['cpu']}, {env['cores']} cores, load {env['load_average_at_start']}")

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEMO_TARGET / "tokenizer.json"))
    plist = bench_prompts(args.quick)
    ids = [tok.encode(text).ids for _, text in plist]
    edge_reason = edge.runtime_available()
    if edge_reason:
        log(f"{edge_reason}: edge-spec systems are skipped; peers still run")

    results: dict[str, Any] = {"environment": env, "prompts": [{"kind": k, "text": t} for k, t in plist],
                               "edge_spec_skipped": edge_reason, "pairs": {}}
    bench_hf = ensure_bench_checkpoint(args.work)
    results["bench_target_check"] = json.loads((bench_hf / "CHECK.json").read_text())
    log("memory bandwidth")
    results["bandwidth"] = bandwidth.measure_bandwidth(threads=args.threads)
    for pair in args.pairs:
        target_hf = DEMO_TARGET if pair == "demo" else bench_hf
        results["pairs"][pair] = run_pair(pair, target_hf, args.work, args, ids, edge_reason)
    results["analysis"] = report.analyse(results)
    stem = "quick" if args.quick else "latest"
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{stem}.json"
    path.write_text(json.dumps(results, separators=(",", ":"), default=str) + "\n")
    pngs = report.plots(results, args.results, stem)
    md = report.markdown(results, pngs)
    (args.results / f"{stem}.md").write_text(md)
    print(md)
    log(f"wrote {path}, {args.results / (stem + '.md')}, {', '.join(p.name for p in pngs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
