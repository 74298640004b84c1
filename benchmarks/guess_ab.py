"""The padding row's guess, on and off, in one engine: what the free one-token draft buys speculative decoding.

    python benchmarks/guess_ab.py --bundle DEMO [--prompts 32] [--tokens 96] [--threads 2] \
        [--temperatures 0 0.7] [--json out.json]

A target graph that pads 1-token passes to its batch-invariant 2 rows computes a row it throws away whenever a
step drafts nothing; the bundle's n-gram table guesses the next token into that row
(``Decoder.draft_guess``). One engine (the bundle as a user loads it: hybrid drafting, adaptive draft length), for
each held-out chat prompt of ``benchmarks/chat_prompts.py`` and each temperature: plain AR, then speculative
decoding with the guess and without it (the table's ``guess`` array set aside), the two in alternating order so
machine noise hits both alike. Sampled runs are seeded, so the three texts must be identical (the coupling makes
sampled text a function of the seed, never of the drafts); greedy texts must equal AR's. Reports per temperature
tokens/s of each, the ratios, tokens per target pass, how many steps carried a guess and how many guesses were
accepted. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_prompts import CHAT_PROMPTS, chat_messages  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec import Engine

    e = Engine.load(args.bundle, max_context=1024, threads=args.threads)
    table = e._dec.table
    if table is None or table.guess is None:
        print(f"{args.bundle} has no n-gram table with guesses (export it with --ngrams); nothing to compare.")
        return 2
    guess = table.guess
    prompts = list(CHAT_PROMPTS[:args.prompts])
    e.chat(chat_messages(prompts[0]), max_new_tokens=8, speculative=False)  # warm-up: first passes prepack
    e.chat(chat_messages(prompts[0]), max_new_tokens=8)
    rows = []
    for temp in args.temperatures:
        acc = {k: {"tokens": 0, "s": 0.0, "passes": 0, "same": 0} for k in ("ar", "on", "off")}
        guessed = guess_ok = steps = 0
        for i, p in enumerate(prompts):
            msgs = chat_messages(p)
            kw = {"max_new_tokens": args.tokens, "temperature": temp, "seed": None if temp == 0 else i}
            e.reset()
            ar = e.chat(msgs, speculative=False, **kw)
            runs = {}
            for which in (("on", "off") if i % 2 == 0 else ("off", "on")):
                table.guess = guess if which == "on" else None
                e.reset()
                runs[which] = e.chat(msgs, **kw)
            table.guess = guess
            for name, r in (("ar", ar), *runs.items()):
                a = acc[name]
                a["tokens"] += r.stats.tokens
                a["s"] += r.stats.seconds
                a["passes"] += r.stats.target_passes
                a["same"] += int(r.token_ids == ar.token_ids)
            guessed += runs["on"].stats.guess_drafted
            guess_ok += runs["on"].stats.guess_accepted
            steps += runs["on"].stats.target_passes
        tps = {k: a["tokens"] / a["s"] for k, a in acc.items()}
        row = {"temperature": temp, "prompts": len(prompts), "ar_tok_s": round(tps["ar"], 1),
               "sd_tok_s": round(tps["on"], 1), "sd_no_guess_tok_s": round(tps["off"], 1),
               "sd_ar": round(tps["on"] / tps["ar"], 3), "sd_no_guess_ar": round(tps["off"] / tps["ar"], 3),
               "guess_on_off": round(tps["on"] / tps["off"], 3),
               "tokens_per_pass": round(acc["on"]["tokens"] / max(acc["on"]["passes"], 1), 3),
               "tokens_per_pass_no_guess": round(acc["off"]["tokens"] / max(acc["off"]["passes"], 1), 3),
               "steps_with_guess": round(guessed / max(steps, 1), 3),
               "guess_acceptance": round(guess_ok / max(guessed, 1), 3),
               "identical_to_ar": f"{acc['on']['same']}/{len(prompts)} on, {acc['off']['same']}/{len(prompts)} off"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| T | AR tok/s | SD tok/s, guess / none | SD/AR, guess / none | guess / none "
          "| tokens per pass, guess / none | steps with a guess | guesses accepted | same as AR |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['temperature']:g} | {r['ar_tok_s']} | {r['sd_tok_s']} / {r['sd_no_guess_tok_s']} | "
              f"{r['sd_ar']:.3f}x / {r['sd_no_guess_ar']:.3f}x | {r['guess_on_off']:.3f}x | {r['tokens_per_pass']} / "
              f"{r['tokens_per_pass_no_guess']} | {r['steps_with_guess']:.1%} | {r['guess_acceptance']:.3f} | "
              f"{r['identical_to_ar']} |")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "threads": args.threads, "tokens": args.tokens,
                                         "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
