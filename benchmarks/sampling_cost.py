"""What sampling costs outside ONNX Runtime at the chat defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05).

    python benchmarks/sampling_cost.py [--bundle demo] [--prompts 3] [--tokens 128] [--rounds 2]

1. ``probs()`` on [2, V] logits (a 1-draft verify pass; V = the bundle's vocabulary), per filter combination,
   median of 200 calls.
2. ``Engine.chat`` at the chat defaults, speculative (the demo's way), over a few chat prompts: tokens/s and the
   share of wall time outside ONNX Runtime (``Stats.seconds - target_seconds - drafter_seconds``); the first round
   warms up. Run it at two revisions to compare them (``git stash`` / ``git checkout``): same seeds, same prompts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_prompts import CHAT_PROMPTS, chat_messages  # noqa: E402

CHAT = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default="demo")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from edge_spec import Engine
    from edge_spec.runtime.sampling import SamplingConfig, probs

    engine = Engine.load(args.bundle, max_context=1024)
    vocab = engine.manifest.target.vocab_size
    logits = np.random.default_rng(0).normal(0, 3, (2, vocab)).astype(np.float32)
    out = np.empty_like(logits)
    for name, kw in (("temperature only", {"temperature": 0.8}), ("top-k 40", {"temperature": 0.8, "top_k": 40}),
                     ("top-p 0.95", {"temperature": 0.8, "top_p": 0.95}),
                     ("min-p 0.05", {"temperature": 0.8, "min_p": 0.05}), ("chat defaults (all three)", CHAT)):
        cfg = SamplingConfig(**kw)
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            probs(logits, cfg, out=out)
            times.append(time.perf_counter() - t0)
        print(f"probs [2, {vocab}], {name}: {statistics.median(times) * 1e3:.2f} ms", flush=True)
    tokens = seconds = outside = 0.0
    for r in range(args.rounds + 1):
        for i, p in enumerate(CHAT_PROMPTS[:args.prompts]):
            engine.reset()
            s = engine.chat(chat_messages(p), max_new_tokens=args.tokens, seed=i, **CHAT).stats
            if r:  # round 0 warms up
                tokens += s.tokens
                seconds += s.seconds
                outside += s.seconds - s.target_seconds - s.drafter_seconds
    print(f"chat at the defaults, speculative: {tokens / seconds:.1f} tok/s, {outside / seconds:.0%} of the time "
          "outside ONNX Runtime")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
