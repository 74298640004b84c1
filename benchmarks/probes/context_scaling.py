"""Plain decoding speed as the context fills: edge-spec's target step vs llama.cpp's at the same depths.

Benchmarks elsewhere decode ~100 tokens after a short chat prompt; a chat that goes on fills the context. For
each depth d (positions already cached) this times one decode step:

* edge-spec: the bundle's target session, exactly as the runtime runs a plain step (``ModelSession.forward`` of
  one token, padded to the session's minimum rows), after ``d`` cached positions (their keys are zeros: the cost
  does not depend on the values), ``--repeats`` steps, min and median;
* llama.cpp (``--gguf``, binaries from benchmarks/build_llamacpp.sh): ``llama-bench -p 0 -n N -d d`` on the same
  file, threads and depths (its mean tokens/s over its repetitions, as ms per token).

The two run one after the other, never at once; the ratio at each depth is within this one run. ``--also NAME=DIR``
times more bundles' target steps in the same run, one bundle after the other (e.g. the graph variants
``benchmarks/offset_cost.py`` writes), each with its own ratio to llama.cpp.

    python benchmarks/probes/context_scaling.py --bundle DEMO --gguf SmolLM2-135M-Instruct.Q4_1.gguf --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # benchmarks/
sys.path.insert(0, str(HERE.parent))


def edge_steps(bundles: dict[str, Path], depths: list[int], threads: int,
               repeats: int) -> dict[str, dict[int, dict[str, float]]]:
    """{name: {depth: {min_ms, median_ms}}} of one plain decode step of each bundle's target after ``depth``
    positions; one bundle loaded at a time (two sessions with spinning pools in one process take each other's
    cores: interleaved, the 2-thread medians doubled)."""
    import gc

    from benchmarks.lib.timing import step_times
    from edge_spec import Engine

    out: dict[str, dict[int, dict[str, float]]] = {}
    for name, bundle in bundles.items():
        engine = Engine.load(bundle, drafting="none", max_context=max(depths) + 16, threads=threads)
        out[name] = {}
        for d in depths:
            out[name][d] = step_times({name: engine}, d + 1, repeats)[name]  # a step at d + 1: d positions cached
            print(f"{name} threads={threads} depth={d}: {out[name][d]}", flush=True)
        del engine
        gc.collect()
    return out


def llama_steps(gguf: Path, depths: list[int], threads: int, tokens: int, reps: int) -> dict[int, dict[str, float]]:
    """{depth: {ms_per_token, tok_per_s}} from llama-bench's text generation at each depth."""
    from benchmarks.lib.llamacpp import bin_dir

    bench = (bin_dir() or Path("/nonexistent")) / "llama-bench"
    if not bench.is_file():
        raise SystemExit("llama-bench is not built; run benchmarks/build_llamacpp.sh (or leave out --gguf).")
    cmd = [str(bench), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(tokens), "-r", str(reps),
           "-d", ",".join(str(d) for d in depths), "-o", "json"]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    out = {}
    for r in rows:
        d = int(r.get("n_depth", 0))
        out[d] = {"tok_per_s": round(r["avg_ts"], 2), "ms_per_token": round(1e3 / r["avg_ts"], 3)}
        print(f"llama.cpp threads={threads} depth={d}: {out[d]}", flush=True)
    return out


def _over(edge: dict[int, dict[str, float]], llama: dict[int, dict[str, float]]) -> dict[int, float]:
    """edge-spec's median ms per step over llama.cpp's ms per token, at each depth both measured."""
    return {d: round(edge[d]["median_ms"] / llama[d]["ms_per_token"], 3) for d in edge if d in llama}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path, help="a bundle directory, or demo")
    ap.add_argument("--gguf", type=Path, help="the target's GGUF for llama.cpp at the same depths (optional)")
    ap.add_argument("--depths", type=int, nargs="+", default=[128, 1024, 2048, 4000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=40, help="edge-spec steps per depth")
    ap.add_argument("--llama-tokens", type=int, default=32, help="llama-bench -n")
    ap.add_argument("--llama-reps", type=int, default=3, help="llama-bench -r")
    ap.add_argument("--also", nargs="+", default=[], metavar="NAME=DIR",
                    help="more bundles whose target steps are timed in the same run")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "context_scaling.json")
    args = ap.parse_args(argv)

    from edge_spec.demo import resolve_bundle

    bundle = resolve_bundle(args.bundle)
    result: dict[str, object] = {"bundle": str(bundle), "gguf": str(args.gguf) if args.gguf else None,
                                 "depths": args.depths, "date": time.strftime("%Y-%m-%d"),
                                 "python": platform.python_version(), "runs": {}}
    import onnxruntime

    result["onnxruntime"] = onnxruntime.__version__
    also = dict(spec.split("=", 1) for spec in args.also)
    if also:
        result["also"] = also
    for threads in args.threads:
        steps = edge_steps({"edge-spec": bundle, **{k: Path(v) for k, v in also.items()}}, args.depths, threads,
                           args.repeats)
        run: dict[str, object] = {"edge_spec": steps.pop("edge-spec")}
        if steps:
            run["also"] = steps
        if args.gguf:
            llama = run["llama_cpp"] = llama_steps(args.gguf, args.depths, threads, args.llama_tokens,
                                                   args.llama_reps)
            run["edge_over_llama_ms"] = _over(run["edge_spec"], llama)
            if steps:
                run["also_over_llama_ms"] = {name: _over(s, llama) for name, s in steps.items()}
        result["runs"][str(threads)] = run
    print(json.dumps(result, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
