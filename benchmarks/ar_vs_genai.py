"""Plain decoding, edge-spec vs ONNX Runtime GenAI's C++ loop on the *same* target graph: alternating processes.

    python benchmarks/ar_vs_genai.py --bundle DEMO [--threads 1 2] [--rounds 3] [--prompts 6] [--tokens 96] \
        [--ort-config KEY=VALUE ...] [--systems edge-spec genai edge-spec+config]

Each measurement is its own process (one system loaded, warmed up on one prompt, then the best of 2 passes over the
prompts), and the systems alternate round by round, so drift on a noisy machine hits both alike. edge-spec runs
``Engine.load(drafting="none")`` at its defaults (context 4096, spinning when it has more than one thread); GenAI
runs the bundle's ``target/genai_config.json`` with ``intra_op_num_threads`` set and its own defaults otherwise
(spinning on), ``max_length`` = prompt + tokens. Greedy; same prompt ids (benchmarks/chat_prompts.py rendered by the
bundle's chat format). Needs ``onnxruntime-genai`` (the benchmarks' peers environment).

``--ort-config KEY=VALUE`` adds the system ``edge-spec+config``: edge-spec with those ONNX Runtime session config
entries added to the options ``edge_spec.runtime.options.session_options`` builds (e.g.
``session.dynamic_block_base=4``), to try a thread-pool or kernel setting against the runtime's own in the same
alternation; ``--systems`` picks which systems run (default: all given).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _with_config(entries: list[str]) -> None:
    """Make every session the runtime creates carry ``entries`` (KEY=VALUE) on top of its own options."""
    import edge_spec.runtime.options as options
    import edge_spec.runtime.session as session

    base = options.session_options

    def patched(threads: int = 0, spin: bool = False):  # noqa: ANN202 - returns ort.SessionOptions
        so = base(threads, spin)
        for entry in entries:
            key, _, value = entry.partition("=")
            so.add_session_config_entry(key, value)
        return so

    options.session_options = patched
    session.session_options = patched


def worker(system: str, bundle: Path, threads: int, prompts: int, tokens: int, config: list[str]) -> float:
    """tok/s of ``system`` (best of 2 passes over the prompts, after a warm-up)."""
    from chat_prompts import CHAT_PROMPTS
    from vs_llamacpp import prompt_ids

    ids = prompt_ids(bundle, list(CHAT_PROMPTS[:prompts]))
    if system.startswith("edge-spec"):
        from edge_spec import Engine

        if system == "edge-spec+config":
            _with_config(config)

        engine = Engine.load(bundle, threads=threads, max_context=4096, drafting="none")
        opts = {"max_new_tokens": tokens, "temperature": 0.0, "speculative": False, "stop_token_ids": ()}

        def run(p: list[int]) -> int:
            return len(engine.generate(p, opts).token_ids)
    else:
        from peers import genai_generate, genai_model

        model = genai_model(str(bundle / "target"), threads)

        def run(p: list[int]) -> int:
            return len(genai_generate(model, p, tokens)[0])
    run(ids[0])
    best = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        n = sum(run(p) for p in ids)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--ort-config", nargs="+", default=[], metavar="KEY=VALUE",
                    help="session config entries of the system edge-spec+config")
    ap.add_argument("--systems", nargs="+", choices=("edge-spec", "genai", "edge-spec+config"))
    ap.add_argument("--out", type=Path, help="write the measurements as JSON")
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(worker(args.worker[0], args.bundle, int(args.worker[1]), args.prompts, args.tokens, args.ort_config))
        return 0
    systems = args.systems or ["edge-spec", "genai"] + (["edge-spec+config"] if args.ort_config else [])
    if "edge-spec+config" in systems and not args.ort_config:
        ap.error("edge-spec+config needs --ort-config KEY=VALUE")
    results: dict[str, dict[str, list[float]]] = {}
    for threads in args.threads:
        res = results.setdefault(str(threads), {s: [] for s in systems})
        for r in range(args.rounds):
            for system in systems[r % len(systems):] + systems[:r % len(systems)]:  # rotated: no system always first
                cmd = [sys.executable, __file__, "--bundle", str(args.bundle), "--prompts", str(args.prompts),
                       "--tokens", str(args.tokens), "--worker", system, str(threads)]
                cmd += ["--ort-config", *args.ort_config] if args.ort_config else []
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                res[system].append(round(float(out.stdout.strip().splitlines()[-1]), 1))
        first, rest = systems[0], systems[1:]
        for other in rest:
            ratios = [round(a / b, 3) for a, b in zip(res[first], res[other])]
            res[f"{first} / {other} per round"] = ratios  # type: ignore[assignment]
            print(f"{threads} thread(s): {first} {res[first]} tok/s, {other} {res[other]} tok/s; per round {ratios}, "
                  f"best vs best {max(res[first]) / max(res[other]):.3f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"bundle": str(args.bundle), "prompts": args.prompts, "tokens": args.tokens,
                                        "ort_config": args.ort_config, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
