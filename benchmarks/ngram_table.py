"""The n-gram draft table (``export --ngrams``): what more data or other thresholds would buy; where drafts come from.

    python benchmarks/ngram_table.py --bundle DEMO --data models/smollm2-data/answers*.npz [--prompts 32] \
        [--tokens 128] [--threads 2] [--json out.json]

1. The bundle's target answers the held-out chat prompts of ``benchmarks/chat_prompts.py`` (never in any answers
   file) by plain decoding, greedy and at T=0.7 (seeded), ``--tokens`` each.
2. Replay: those answers are re-drafted position by position as the runtime's lookup does (context lookup of the
   last 3..2 tokens first, else the table), always 3 drafts, counting the answer tokens each step would commit;
   tokens per target pass for tables built from 1/8, 1/4, 1/2 and all of the training conversations (a fixed
   shuffle) and for other count / share thresholds. Timing-free: what the table could give, not what the adaptive
   policy makes of it (``benchmarks/drafter_compare.py`` measures that).
3. Where the drafts of the real engine come from (hybrid drafting, the bundle's table if it has one): per source
   (context lookup, table, drafter model, none) the steps, their draft lengths and acceptance by depth.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_prompts import CHAT_PROMPTS, chat_messages  # noqa: E402

TEMPERATURES = (0.0, 0.7)


def answers(engine, prompts: list[str], tokens: int) -> list[dict]:
    """The target's own answers (plain decoding): [{T, prompt ids, answer ids}]."""
    out = []
    for temp in TEMPERATURES:
        for i, p in enumerate(prompts):
            engine.reset()
            r = engine.chat(chat_messages(p), max_new_tokens=tokens, temperature=temp, seed=i, speculative=False)
            ids = engine.context
            out.append({"T": temp, "prompt": list(ids[:len(ids) - len(r.token_ids)]), "answer": list(r.token_ids)})
    return out


def replay(runs: list[dict], table, temp: float, gamma: int = 3) -> float:
    """Answer tokens per target pass when every step drafts ``gamma`` tokens by lookup, else from ``table``."""
    from edge_spec.runtime.drafting import lookup_draft

    passes = tokens = 0
    for r in (r for r in runs if r["T"] == temp):
        seq = np.asarray(r["prompt"] + r["answer"], np.int64)
        i = len(r["prompt"])
        while i < len(seq):
            d = lookup_draft(seq, i, gamma, ngram_min=2)
            if not len(d) and table is not None:
                d = table.draft(seq, i, gamma)
            m = 0
            while m < len(d) and i + m < len(seq) and d[m] == seq[i + m]:
                m += 1
            i += m + 1
            passes += 1
        tokens += len(r["answer"])
    return round(tokens / max(passes, 1), 3)


def sources(engine, prompts: list[str], tokens: int) -> dict:
    """Per temperature and draft source: steps, draft-length histogram, acceptance by depth (the real engine)."""
    import edge_spec.runtime.speculative as spec

    steps: list = []
    accept = spec.Decoder.accept

    def record(self, g, accepted, nxt, stop, budget):
        step = accept(self, g, accepted, nxt, stop, budget)
        steps.append(step)
        return step

    spec.Decoder.accept = record
    out = {}
    try:
        for temp in TEMPERATURES:
            steps.clear()
            for i, p in enumerate(prompts):
                engine.reset()
                engine.chat(chat_messages(p), max_new_tokens=tokens, temperature=temp, seed=i)
            kinds = {"context lookup": lambda s: s.lookup and not s.table, "table": lambda s: s.table,
                     "drafter model": lambda s: s.gamma and not s.lookup, "none": lambda s: not s.gamma}
            for name, pick in kinds.items():
                mine = [s for s in steps if pick(s)]
                reached, kept = collections.Counter(), collections.Counter()
                for s in mine:
                    for d in range(1, s.gamma + 1):
                        reached[d] += 1
                        kept[d] += s.accepted >= d
                out[f"T={temp} {name}"] = {
                    "steps": len(mine), "gamma": dict(sorted(collections.Counter(s.gamma for s in mine).items())),
                    "acceptance_by_depth": {d: round(kept[d] / reached[d], 3) for d in sorted(reached)}}
    finally:
        spec.Decoder.accept = accept
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="answers files (edge-spec distill)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec import Engine
    from edge_spec.distill import ids
    from edge_spec.export import ngrams
    from edge_spec.runtime.ngrams import NgramTable

    engine = Engine.load(args.bundle, max_context=1024, threads=args.threads)
    prompts = list(CHAT_PROMPTS[:args.prompts])
    runs = answers(engine, prompts, args.tokens)
    train, _, _ = ids.read_many(args.data)
    order = np.random.default_rng(0).permutation(len(train))
    rows = [{"table": "none", "entries": 0, **{f"T={t}": replay(runs, None, t) for t in TEMPERATURES}}]

    def add(name: str, seqs: list, **kw) -> None:
        keys, nxt = ngrams.count_table([(s.ids, s.prompt_len) for s in seqs], **kw)
        table = NgramTable(keys, nxt, ngrams.MIN_N, ngrams.MAX_N)
        rows.append({"table": name, "entries": len(keys), **{f"T={t}": replay(runs, table, t) for t in TEMPERATURES}})
        print(rows[-1], flush=True)

    for frac in (0.125, 0.25, 0.5, 1.0):
        part = [train[j] for j in order[:int(frac * len(train))]]
        add(f"{len(part)} conversations (x{frac}), count >= {ngrams.MIN_COUNT}, share >= {ngrams.MIN_SHARE}", part)
    for count, share in ((2, 0.5), (2, 0.6), (3, 0.5), (4, 0.6), (3, 0.7)):
        add(f"all, count >= {count}, share >= {share}", train, min_count=count, min_share=share)
    by_source = sources(engine, prompts[:20], 96)
    for k, v in by_source.items():
        print(k, v)
    print("\n| table | entries | tokens per pass, greedy | T=0.7 |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['table']} | {r['entries']:,} | {r['T=0.0']} | {r['T=0.7']} |")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "prompts": len(prompts), "tokens": args.tokens,
                                         "replay": rows, "sources": by_source}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
