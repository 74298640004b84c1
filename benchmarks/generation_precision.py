"""Distill's batched generation in float32 vs under bfloat16 autocast (`--precision`): tokens/s and agreement.

Both precisions run the same batch (the benchmark chat prompts, repeated to ``--batch`` rows, rendered by the
target's chat template) greedily for ``--tokens`` new tokens, alternating within one process so the machine's
drift hits both; then the greedy answers of the first ``len(CHAT_PROMPTS)`` rows are compared with float32's over
their first 32 tokens (the fidelity measure of benchmarks/fidelity.py, whose float32 reference is the same
transformers model).

    python benchmarks/generation_precision.py --target SmolLM2-135M-Instruct.Q4_1.gguf --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def agreement(ref: list[np.ndarray], other: list[np.ndarray], n: int = 32) -> tuple[int, float]:
    """(answers identical over their first n tokens, mean common prefix length capped at n)."""
    same, prefixes = 0, []
    for a, b in zip(ref, other):
        m = min(len(a), len(b), n)
        diff = np.flatnonzero(a[:m] != b[:m])
        prefixes.append(int(diff[0]) if len(diff) else m)
        same += bool(np.array_equal(a[:n], b[:n]))
    return same, float(np.mean(prefixes))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, type=Path, help="GGUF file or HF checkpoint directory")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "generation_precision.json")
    args = ap.parse_args(argv)

    import torch
    from chat_prompts import CHAT_PROMPTS

    from edge_spec.distill.data import _pad_id, generate
    from edge_spec.distill.target import load_target, render

    torch.set_num_threads(args.threads)
    t = load_target(args.target)
    prompts = [render(t.tokenizer, [{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    batch = (prompts * (args.batch // len(prompts) + 1))[:args.batch]
    rates: dict[str, list[float]] = {"fp32": [], "bf16": []}
    answers: dict[str, list[np.ndarray]] = {}
    for r in range(args.rounds):
        for mode in ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"):
            t0 = time.perf_counter()
            out = generate(t.model, batch, 0.0, args.tokens, t.stop_ids, 32, 0, _pad_id(t), bf16=mode == "bf16")
            dt = time.perf_counter() - t0
            tokens = sum(len(o["answer"]) for o in out)
            rates[mode].append(round(tokens / dt, 1))
            answers[mode] = [o["answer"] for o in out[:len(prompts)]]
            print(f"round {r} {mode}: {tokens} tokens in {dt:.1f}s, {tokens / dt:.1f} tok/s", flush=True)
    same, prefix = agreement(answers["fp32"], answers["bf16"])
    ratios = [round(b / f, 3) for f, b in zip(rates["fp32"], rates["bf16"])]
    result = {"target": str(args.target), "batch": args.batch, "tokens": args.tokens, "threads": args.threads,
              "tok_per_s": rates, "bf16_over_fp32_per_round": ratios,
              "best_over_best": round(max(rates["bf16"]) / max(rates["fp32"]), 3),
              "greedy_agreement_first32": {"identical": same, "of": len(prompts), "mean_common_prefix": prefix},
              "versions": {"torch": torch.__version__, "python": platform.python_version()},
              "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
