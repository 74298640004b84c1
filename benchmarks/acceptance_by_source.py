"""A drafter's γ=1 acceptance on an answers file's held-out prompts, split by where each prompt came from.

The distillation prompt pool mixes built-in templates (edge_spec/distill/prompts.py), self-instruct requests and
user messages the target wrote itself (Magpie). Drafters accept less on chat prompts written apart from the pool
(benchmarks/chat_prompts.py) than on the pool's own held-out prompts; this measures whether prompts of each kind
behave like the chat prompts. Greedy, the drafter's drafts alone (``drafting="model"``), seeded.

    python benchmarks/acceptance_by_source.py --bundle B --data models/smollm2-data/answers-s3.npz --prompts 32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def prompts_by_source(data: Path, tokenizer: Path) -> dict[str, list[list[int]]]:
    """Held-out prompt ids of ``data``, de-duplicated, grouped as built-in / self-instruct request / written."""
    from tokenizers import Tokenizer

    from edge_spec.distill.prompts import builtin_prompts, self_instruct_requests

    z = np.load(data)
    tok = Tokenizer.from_file(str(tokenizer))
    pool, requests = set(builtin_prompts()), set(self_instruct_requests())
    groups: dict[str, list[list[int]]] = {"built-in": [], "self-instruct request": [], "written by the target": []}
    seen: set[tuple[int, ...]] = set()
    for i in np.flatnonzero(z["heldout"]):
        ids = tuple(int(t) for t in z["tokens"][z["seq_off"][i]:z["seq_off"][i] + z["prompt_len"][i]])
        if ids in seen:
            continue
        seen.add(ids)
        text = tok.decode(list(ids), skip_special_tokens=False)
        user = text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0].strip()  # ChatML (the demo's)
        kind = "built-in" if user in pool else "self-instruct request" if user in requests else "written by the target"
        groups[kind].append(list(ids))
    return groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path, help="an answers file (edge-spec distill's answers.npz)")
    ap.add_argument("--prompts", type=int, default=32, help="at most this many prompts of each kind")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.engine import Engine

    m = read_manifest(args.bundle)
    groups = prompts_by_source(args.data, args.bundle / m.tokenizer.files[0])
    engine = Engine.load(args.bundle, max_context=1024, threads=args.threads, drafting="model")
    rows = []
    for kind, prompts in groups.items():
        drafted = accepted = 0
        for j, ids in enumerate(prompts[:args.prompts]):
            engine.reset()
            r = engine.generate(ids, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=j, speculative=True,
                                draft_length=1)
            drafted, accepted = drafted + r.stats.drafted, accepted + r.stats.accepted
        rows.append({"source": kind, "prompts": min(len(prompts), args.prompts), "held_out_prompts": len(prompts),
                     "drafted": drafted, "accepted": accepted, "acceptance": round(accepted / max(drafted, 1), 4)})
        print(f"{kind}: {accepted}/{drafted} = {accepted / max(drafted, 1):.3f} ({rows[-1]['prompts']} of "
              f"{len(prompts)} held-out prompts)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "data": str(args.data), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
