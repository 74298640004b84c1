"""How predictable is the target from its own layers? A reference for what a cheap drafter can reach.

The target writes its greedy answers to the benchmark chat prompts (torch, fp32); one teacher-forced pass then
gives at every answer position the residual stream after each layer l. The target's own final norm and LM head
applied to it (the "logit lens", untrained) predict the next token; the share of positions where that prediction
equals the target's argmax is what the target's first l layers agree with it, at l/L of a target step. A feature
head (``--head``) drafts depth 1 on the same positions from the target's features of the position before (as it
was trained: features at q, embedding of x_{q+1}, predicting x_{q+2}), so its greedy acceptance sits on the same
scale. A trained exit would beat the untrained lens; the lens is a floor for those layers, not a ceiling.

    python benchmarks/early_exit.py --target SmolLM2-135M-Instruct.Q4_1.gguf --head models/smollm2-eagle3 \
        --prompts 96 --tokens 64 --threads 2 --json early_exit.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from acceptance_by_confidence import chat_prompt_ids, depth1_logits, head_arguments, load_pair, teacher_forced

    ap = head_arguments(__doc__)
    args = ap.parse_args(argv)

    import torch

    t0 = time.time()
    target, head = load_pair(args.target, args.head, args.threads)
    model = target.model
    layers = model.config.num_hidden_layers
    prompts = chat_prompt_ids(target, args.prompts)
    agree = [0] * (layers + 1)  # agree[l]: lens after layer l (l = layers: the target itself)
    head_hits = positions = 0
    d2t = head.draft_to_target
    for p, a, ids, logits, feats, hidden in teacher_forced(target, head, prompts, args.tokens, hidden_states=True):
        rows = slice(len(p) - 1, len(p) + len(a) - 1)  # position j - 1 predicts answer token j
        final = logits[rows].argmax(-1)
        with torch.no_grad():
            for layer in range(1, layers):  # hidden[l]: after layer l (the last one is after the norm)
                lens = model.lm_head(model.model.norm(hidden[layer][0, rows])).argmax(-1)
                agree[layer] += int((lens == final).sum())
            drafts = d2t[depth1_logits(model, head, ids, feats).argmax(-1)]  # [S-1]: drafted at q for q + 2
        # answer token j (j >= len(p) + 1) is drafted at q = j - 2; the first answer token has no draft
        js = range(len(p) + 1, len(p) + len(a))
        head_hits += sum(int(drafts[j - 2]) == int(final[j - len(p)]) for j in js)
        positions += len(a)
        agree[layers] += len(a)
    drafted = positions - len(prompts)
    report = {"target": str(args.target), "head": str(args.head), "prompts": len(prompts), "tokens": args.tokens,
              "positions": positions, "torch": torch.__version__,
              "lens_agreement": {str(layer): round(agree[layer] / positions, 4) for layer in range(1, layers + 1)},
              "head_depth1_acceptance": round(head_hits / drafted, 4), "head_positions": drafted,
              "seconds": round(time.time() - t0, 1)}
    print(f"{len(prompts)} chat prompts, {positions} answer positions; the head's depth-1 greedy acceptance "
          f"{report['head_depth1_acceptance']:.3f}")
    for layer in range(1, layers + 1):
        print(f"  layers 1-{layer} ({layer / layers:5.1%} of a step) + final norm + LM head: agree "
              f"{agree[layer] / positions:.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
