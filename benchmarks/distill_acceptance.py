"""Acceptance of a distilled drafter THROUGH an exported bundle, on its held-out prompts.

The training report (``training.json``) measures acceptance proxies in torch against the fp32 target. This
script measures what the runtime sees: the bundle's (quantized) target and drafter, draft length 1 so that
accepted / drafted is the per-token acceptance rate alpha (with longer drafts, tokens after a rejection are
drafted but never judged). Drafts come from the drafter model alone (``drafting="model"``): with hybrid drafting
(the engine's default) prompt-lookup drafts, accepted far more often on repetitive text, would be counted too.
Prompts are the held-out conversations from the drafter's own data directory, as token ids rendered by the
target's chat template when the data was made, or (``--chat``) benchmarks/lib/prompts.py's chat prompts, written
apart from the distillation prompt set and rendered by the bundle's chat format.

Sampled rows are seeded (prompt i, seed i: the coupling), so every draft temperature of ``--draft-ratios`` (the
drafts' temperature over the target's; ``default`` = the runtime's) judges drafts on the very same texts.

Usage:
    python benchmarks/distill_acceptance.py --bundle BUNDLE (--drafter-dir DIR | --data ANSWERS.npz... | --chat) \
        [--prompts 40] \
        [--max-new-tokens 64] [--temperatures 0 0.7] [--draft-ratios default 1.0 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def heldout_prompts(drafter_dir: Path, n: int) -> list[list[int]]:
    """Prompt token ids of the first ``n`` held-out prompts: the evaluation shards' first, then the held-out
    sequences met in the training shards (de-duplicated)."""
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    data = drafter_dir / "data"
    for shard in sorted(data.glob("eval_*.npz")) + sorted(data.glob("gen_*.npz")):
        _add_heldout(np.load(shard), seen, out)
    return out[:n]


def _add_heldout(z: np.lib.npyio.NpzFile, seen: set[tuple[int, ...]], out: list[list[int]]) -> None:
    """Append the prompt ids of ``z``'s held-out sequences (shard or answers file) not seen before."""
    for i in np.flatnonzero(z["heldout"]):
        ids = tuple(int(t) for t in z["tokens"][z["seq_off"][i]:z["seq_off"][i] + z["prompt_len"][i]])
        if ids not in seen:
            seen.add(ids)
            out.append(list(ids))


def answers_prompts(files: list[Path], n: int) -> list[list[int]]:
    """Prompt token ids of the first ``n`` held-out prompts of answers files (``edge-spec distill``'s ids-only
    data, ``data/answers.npz``), in file order, de-duplicated: for a drafter trained with ``--data``."""
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for f in files:
        _add_heldout(np.load(f), seen, out)
    return out[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--drafter-dir", type=Path, help="the edge-spec distill output (has data/)")
    src.add_argument("--data", type=Path, nargs="+", metavar="ANSWERS_NPZ",
                     help="held-out prompts of these answers files instead (a drafter trained with --data)")
    src.add_argument("--chat", action="store_true",
                     help="benchmarks/lib/prompts.py's chat prompts instead (the first --prompts of its 96)")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--draft-ratios", nargs="+", default=["default"], metavar="R",
                    help="sampled rows: drafts at R x the target's temperature (0 = the drafter's argmax; "
                         "'default' = the runtime's default)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec.runtime.engine import Engine

    if args.chat:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from benchmarks.lib.prompts import ALL_CHAT_PROMPTS, prompt_ids

        prompts = prompt_ids(args.bundle, list(ALL_CHAT_PROMPTS[:args.prompts]))
    elif args.data:
        prompts = answers_prompts(args.data, args.prompts)
    else:
        prompts = heldout_prompts(args.drafter_dir, args.prompts)
    if not prompts:
        print(f"no held-out prompts in {args.data or args.drafter_dir / 'data'}", file=sys.stderr)
        return 2
    engine = Engine.load(args.bundle, max_context=1024, threads=args.threads, drafting="model")
    rows = []
    for temp in args.temperatures:
        for ratio in args.draft_ratios if temp > 0 else ["default"]:
            config = {} if ratio == "default" else {"draft_temperature": float(ratio) * temp}
            drafted = accepted = tokens = 0
            t0 = time.time()
            for i, ids in enumerate(prompts):
                engine.reset()
                r = engine.generate(ids, config, max_new_tokens=args.max_new_tokens, temperature=temp, seed=i,
                                    speculative=True, draft_length=1)
                drafted, accepted = drafted + r.stats.drafted, accepted + r.stats.accepted
                tokens += r.stats.tokens
            rows.append({"temperature": temp, "draft_ratio": ratio, "prompts": len(prompts), "tokens": tokens,
                         "drafted": drafted, "accepted": accepted, "acceptance": round(accepted / max(drafted, 1), 4),
                         "seconds": round(time.time() - t0, 1)})
            print(f"T={temp}" + (f", drafts at {ratio} x T" if temp > 0 else "") +
                  f": acceptance {accepted}/{drafted} = {accepted / max(drafted, 1):.3f} "
                  f"({len(prompts)} held-out prompts, {tokens} tokens)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "draft_length": 1, "drafting": "model",
                                         "prompts": "chat" if args.chat else "held-out", "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
