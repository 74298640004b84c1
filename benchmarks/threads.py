"""ONNX Runtime's thread settings for a decode step (issue 44 item 3): pool size, intra-op spinning, the drafter's.

Part 1, the plain step: one ``Engine`` per setting (``drafting="none"``, ``threads`` 1 or 2, ``spin`` on or off),
all loaded at once; 1-token target steps at ``--past`` cached positions, the settings taking turns in blocks of
``--block`` steps (a short sleep between blocks lets a spinning pool go idle before the next setting runs), medians.

Part 2, speculative decoding: the target on ``--threads`` threads with spinning as ``Engine.load`` sets it, the
drafter on 1 or 2 threads of its own (``drafter_threads``); the code prompts, greedy, the settings alternating
prompt by prompt; generated tokens over generation time.

    python benchmarks/threads.py --bundle CODER --past 256 --blocks 8 --prompts 4 --tokens 64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def step_settings(bundle: Path, past: int, blocks: int, block: int) -> dict[str, dict[str, float]]:
    """Median / min ms of a 1-token step for each (threads, spin) setting, the settings in turns."""
    from edge_spec import Engine

    settings = {f"{t} thread{'s' if t > 1 else ''}, spin {'on' if s else 'off'}": (t, s)
                for t in (1, 2) for s in (False, True) if t > 1 or not s}
    engines = {name: Engine.load(bundle, drafting="none", max_context=past + 16, threads=t, spin=s)
               for name, (t, s) in settings.items()}
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for b in range(blocks + 1):
        for name, e in engines.items():
            t = e.target
            for _ in range(block):
                t.rewind_to(0)
                t.kv.length = past - 1  # cost does not depend on the cached values
                t0 = time.perf_counter()
                t.forward([42])
                if b > 0:  # the first block warms up
                    samples[name].append(time.perf_counter() - t0)
            time.sleep(0.05)
    return {k: {"median_ms": round(statistics.median(v) * 1e3, 2), "min_ms": round(min(v) * 1e3, 2)}
            for k, v in samples.items()}


def drafter_settings(bundle: Path, threads: int, prompts: int, tokens: int) -> dict[str, dict[str, float]]:
    """Speculative tokens/s with the drafter on 1 or 2 threads, the target on ``threads``."""
    from benchmarks.lib.prompts import CODE_PROMPTS, prompt_ids
    from edge_spec import Engine

    ids = prompt_ids(bundle, list(CODE_PROMPTS[:prompts]))
    engines = {f"drafter {d} thread{'s' if d > 1 else ''}": Engine.load(bundle, max_context=4096, threads=threads,
                                                                       drafter_threads=d) for d in (1, 2)}
    rates: dict[str, list[float]] = {k: [] for k in engines}
    cfg = {"max_new_tokens": tokens, "stop_token_ids": ()}
    for e in engines.values():
        e.generate(ids[0], {"max_new_tokens": 8, "stop_token_ids": ()})
    for j, p in enumerate(ids):
        order = list(engines.items()) if j % 2 == 0 else list(engines.items())[::-1]
        for name, e in order:
            t0 = time.perf_counter()
            r = e.generate(p, cfg)
            rates[name].append(len(r.token_ids) / (time.perf_counter() - t0))
    return {k: {"median_tok_s": round(statistics.median(v), 2)} for k, v in rates.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2, help="the target's threads in part 2")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "threads.json")
    args = ap.parse_args(argv)

    import onnxruntime

    from edge_spec.demo import resolve_bundle

    bundle = resolve_bundle(args.bundle)
    result: dict[str, Any] = {"bundle": str(bundle), "past": args.past, "date": time.strftime("%Y-%m-%d"),
                              "python": platform.python_version(), "onnxruntime": onnxruntime.__version__}
    result["step"] = step_settings(bundle, args.past, args.blocks, args.block)
    print(json.dumps(result["step"], indent=1), flush=True)
    if args.prompts > 0:
        result["speculative"] = drafter_settings(bundle, args.threads, args.prompts, args.tokens)
        print(json.dumps(result["speculative"], indent=1), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
