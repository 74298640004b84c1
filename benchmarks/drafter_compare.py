"""Drafters compared through their bundles on the same target graph: speed of speculative vs plain decoding.

    python benchmarks/drafter_compare.py --bundle eagle3=B1 --bundle layers=B2 [--prompts 20] [--tokens 96] [--code] \
        [--threads 2] [--temperatures 0 0.7] [--drafting auto|model] [--confidence 0.3 0.5] \
        [--draft-ratios 1.0 0.7] [--json out.json]

Every bundle is loaded in this one process (same threads); for each held-out chat prompt of
``benchmarks/lib/prompts.py`` (never in the distillation prompt set; ``--code``: its coding tasks, never in
models/coder-data's prompts) and each temperature, each bundle
generates plain AR and speculatively (default adaptive draft length, hybrid drafting with lookup, as a user
gets it), interleaved so machine noise hits every system alike; sampled runs are seeded (same seed -> the same
text AR and speculative, so both make the same tokens). Reports per bundle and temperature: tokens/s AR and
speculative (total tokens / total seconds), the ratio, acceptance of drafter-model drafts, mean tokens per target
pass, and whether the greedy texts equal AR token for token. ``--confidence`` runs each bundle's speculative
decoding once per drafter confidence threshold (``GenerationConfig.confidence_threshold``: drafting stops when the
drafter's top probability is below it), as systems named ``NAME@T`` that share the bundle's AR runs;
``--draft-ratios`` likewise runs sampled rows once per draft temperature (``GenerationConfig.draft_temperature`` =
R x the target's; systems ``NAME~R``). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lib.prompts import CHAT_PROMPTS, CODE_PROMPTS, chat_messages  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--drafting", default="auto", choices=("auto", "model"),
                    help="auto: hybrid with prompt lookup, as a user gets it (default); model: the drafter alone")
    ap.add_argument("--confidence", type=float, nargs="+", default=[None],
                    help="drafter confidence thresholds to compare (default: the engine's own)")
    ap.add_argument("--draft-ratios", type=float, nargs="+", default=[None],
                    help="sampled drafts' temperature over the target's, to compare (default: the engine's own)")
    ap.add_argument("--code", action="store_true", help="the coding tasks of benchmarks/lib/prompts.py, not the chat")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec import Engine

    engines = {}
    for spec in args.bundle:
        name, _, path = spec.partition("=")
        # several engines in one process: their thread pools must not spin (verify_cost.py measured 1.5x passes)
        engines[name] = Engine.load(path, max_context=1024, threads=args.threads, drafting=args.drafting,
                                    spin=None if len(args.bundle) == 1 else False)
    prompts = list((CODE_PROMPTS if args.code else CHAT_PROMPTS)[:args.prompts])
    for e in engines.values():  # warm-up: first passes prepack weights
        e.chat(chat_messages(prompts[0]), max_new_tokens=8, speculative=False)
        e.chat(chat_messages(prompts[0]), max_new_tokens=8)
    rows = []
    for temp in args.temperatures:
        variants = [(c, r) for c in args.confidence for r in (args.draft_ratios if temp > 0 else [None])]
        systems = [(n, c, r) for n in engines for c, r in variants]
        acc = {_system(n, c, r): {"ar_tokens": 0, "ar_s": 0.0, "sd_tokens": 0, "sd_s": 0.0, "drafted": 0, "accepted": 0,
                               "lookup_drafted": 0, "passes": 0, "same": 0} for n, c, r in systems}
        for i, p in enumerate(prompts):
            msgs = chat_messages(p)
            for name, e in engines.items():
                seed = None if temp == 0 else i
                e.reset()
                ar = e.chat(msgs, max_new_tokens=args.tokens, temperature=temp, seed=seed, speculative=False)
                for conf, ratio in variants:
                    a = acc[_system(name, conf, ratio)]
                    e.reset()
                    sd = e.chat(msgs, {"max_new_tokens": args.tokens, "temperature": temp, "seed": seed,
                                       "confidence_threshold": conf,
                                       "draft_temperature": None if ratio is None else ratio * temp})
                    a["ar_tokens"] += ar.stats.tokens
                    a["ar_s"] += ar.stats.seconds
                    a["sd_tokens"] += sd.stats.tokens
                    a["sd_s"] += sd.stats.seconds
                    a["drafted"] += sd.stats.drafted - sd.stats.lookup_drafted
                    a["accepted"] += sd.stats.accepted - sd.stats.lookup_accepted
                    a["lookup_drafted"] += sd.stats.lookup_drafted
                    a["passes"] += sd.stats.target_passes
                    a["same"] += int(sd.token_ids == ar.token_ids)
        for name, a in acc.items():
            ar_tps, sd_tps = a["ar_tokens"] / a["ar_s"], a["sd_tokens"] / a["sd_s"]
            row = {"bundle": name, "temperature": temp, "prompts": len(prompts), "ar_tok_s": round(ar_tps, 1),
                   "sd_tok_s": round(sd_tps, 1), "speedup": round(sd_tps / ar_tps, 3),
                   "model_acceptance": round(a["accepted"] / max(a["drafted"], 1), 3),
                   "tokens_per_pass": round(a["sd_tokens"] / max(a["passes"], 1), 2),
                   "lookup_share": round(a["lookup_drafted"] / max(a["lookup_drafted"] + a["drafted"], 1), 3),
                   "identical_to_ar": f"{a['same']}/{len(prompts)}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| bundle | T | AR tok/s | SD tok/s | SD/AR | drafter acceptance | tokens/target pass | same as AR |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bundle']} | {r['temperature']:g} | {r['ar_tok_s']} | {r['sd_tok_s']} | {r['speedup']:.2f}x | "
              f"{r['model_acceptance']:.3f} | {r['tokens_per_pass']} | {r['identical_to_ar']} |")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "tokens": args.tokens, "drafting": args.drafting,
                                         "rows": rows}, indent=2))
    return 0


def _system(name: str, confidence: float | None, ratio: float | None) -> str:
    return name + ("" if confidence is None else f"@{confidence:g}") + ("" if ratio is None else f"~{ratio:g}")


if __name__ == "__main__":
    raise SystemExit(main())
