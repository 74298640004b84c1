"""What rounding an EAGLE-3 head's weights costs its first drafts, part by part (torch, float activations).

The target writes its greedy answers to the benchmark chat prompts (torch fp32); one teacher-forced pass gives its
argmax and aux features at every answer position; the head drafts depth 1 from them as it was trained, first with
its float weights, then with the weights of some of its parts replaced by what the exporter's round-to-nearest
quantizer (``gguf_quant.quantize_float``, the graph's MatMulNBits blocks) makes of them. Agreement with the target's
argmax is the greedy acceptance at γ=1 over every answer position. Only the weights change between rows, so the
differences are the rounding's alone (the graph's int8 activations are not modelled: distill_acceptance.py through
bundles exported at each ``--drafter-quant`` measures everything together).

Usage:
    python benchmarks/head_precision.py --target SmolLM2-135M-Instruct.Q4_1.gguf --head models/smollm2-eagle3 \
        [--prompts 32] [--tokens 64] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

PARTS = {"fc": ("fc.",), "attention": ("midlayer.self_attn.",), "mlp": ("midlayer.mlp.",), "lm_head": ("lm_head.",)}


def rounded(head, names: list[str], bits: int, block: int):
    """A copy of ``head`` whose weights ``names`` are quantized to ``bits`` in blocks of ``block`` and back."""
    import torch

    from edge_spec.export.gguf_quant import dequantize, quantize_float

    h = copy.deepcopy(head)
    params = dict(h.named_parameters())
    for n in names:
        w = params[n].detach().float().numpy()
        params[n].data = torch.from_numpy(dequantize(quantize_float(w, bits, block)).reshape(w.shape))
    return h


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from acceptance_by_confidence import chat_prompt_ids, depth1_logits, head_arguments, load_pair, teacher_forced

    args = head_arguments(__doc__).parse_args(argv)

    import torch

    t0 = time.time()
    target, head = load_pair(args.target, args.head, args.threads)
    model = target.model
    # (ids [1, S], features [1, S, 3H], target argmax [S], prompt length, answer length)
    cases = [(ids, feats, logits.argmax(-1), len(p), len(a))
             for p, a, ids, logits, feats, _ in teacher_forced(target, head, chat_prompt_ids(target, args.prompts),
                                                               args.tokens)]

    def agreement(h) -> float:
        hits = []
        with torch.no_grad():
            for ids, feats, best, lp, la in cases:
                drafts = h.draft_to_target[depth1_logits(model, h, ids, feats).argmax(-1)]  # drafts[q]: x_{q+2}
                hits += [int(drafts[j - 2]) == int(best[j - 1]) for j in range(lp, lp + la)]
        return float(np.mean(hits))

    weights = [n for n, p in head.named_parameters() if p.ndim == 2 and n.startswith(("fc.", "midlayer.", "lm_head."))]
    rows = [("float (as trained)", agreement(head))]
    for bits, block in ((8, 32), (4, 32), (4, 16)):
        rows.append((f"all int{bits}, block {block}", agreement(rounded(head, weights, bits, block))))
    for part, prefixes in PARTS.items():
        names = [n for n in weights if n.startswith(prefixes)]
        rows.append((f"only {part} int4", agreement(rounded(head, names, 4, 32))))
    print(f"{len(cases)} chat prompts, {sum(c[4] for c in cases)} answer positions; depth-1 greedy agreement:")
    for name, a in rows:
        print(f"  {name:<24} {a:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"target": str(args.target), "head": str(args.head), "tokens": args.tokens,
                                         "torch": torch.__version__, "rows": dict(rows),
                                         "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
