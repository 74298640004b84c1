"""fp16 vs fp32 KV cache on two bundles of the same pair (``export --kv-dtype fp16`` and the default).

    python benchmarks/kv_dtype.py --fp32 BUNDLE32 --fp16 BUNDLE16 [--prompts 20] [--tokens 48] [--threads 1]

1. Decode-step time of the target at contexts 512 and 2048: one 1-token pass after ``ctx - 1``
   cached positions, the two graphs interleaved (A B A B ...) so load on a shared machine hits both
   alike; min and median over the repeats, and the fp16/fp32 ratio of each.
2. Greedy output on chat prompts: how many of the fp16 bundle's plain (AR) continuations equal the fp32
   bundle's, and the mean index of the first difference.
3. Exactness within the fp16 bundle: greedy speculative (fixed draft length, so every step drafts)
   == greedy AR, token for token, per prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from chat_prompts import CHAT_PROMPTS, chat_messages  # noqa: E402

from edge_spec import Engine  # noqa: E402


def step_times(engines: dict[str, Engine], ctx: int, repeats: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for i in range(repeats + 3):
        for name, e in engines.items():
            t = e.target
            t.rewind_to(0)
            t.kv.length = ctx - 1  # positions [0, ctx - 1) hold (zero) keys: the cost does not depend on values
            t0 = time.perf_counter()
            t.forward([42])
            if i >= 3:
                samples[name].append(time.perf_counter() - t0)
            t.rewind_to(0)
    return {k: {"min_ms": round(min(v) * 1e3, 3), "median_ms": round(statistics.median(v) * 1e3, 3)}
            for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp32", type=Path, required=True)
    ap.add_argument("--fp16", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--draft-length", type=int, default=3, help="fixed gamma of the exactness check")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args(argv)
    out: dict[str, object] = {}

    for ctx in () if args.skip_timing else (512, 2048):
        engines = {k: Engine.load(b, drafting="none", max_context=ctx + 16, threads=args.threads)
                   for k, b in (("fp32", args.fp32), ("fp16", args.fp16))}
        t = step_times(engines, ctx, args.repeats)
        t["ratio_fp16_over_fp32"] = {s: round(t["fp16"][s] / t["fp32"][s], 3) for s in ("min_ms", "median_ms")}
        out[f"step_ctx{ctx}"] = t
        print(json.dumps({f"step_ctx{ctx}": t}), flush=True)
        del engines

    cfg = {"max_new_tokens": args.tokens, "stop_token_ids": ()}
    e32 = Engine.load(args.fp32, max_context=512, threads=args.threads)
    e16 = Engine.load(args.fp16, max_context=512, threads=args.threads)
    same, first, sd_eq, drafted = 0, [], 0, 0
    for p in CHAT_PROMPTS[:args.prompts]:
        msgs = chat_messages(p)
        a = e32.chat(msgs, cfg, speculative=False).token_ids
        b = e16.chat(msgs, cfg, speculative=False).token_ids
        s = e16.chat(msgs, cfg, draft_length=args.draft_length)
        same += a == b
        first.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)))
        sd_eq += s.token_ids == b
        drafted += s.stats.drafted
    out["greedy"] = {"prompts": args.prompts, "tokens": args.tokens, "fp16_equals_fp32": same,
                     "mean_first_difference": round(float(np.mean(first)), 1),
                     "fp16_speculative_equals_fp16_ar": sd_eq, "drafted": drafted}
    print(json.dumps({"greedy": out["greedy"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
