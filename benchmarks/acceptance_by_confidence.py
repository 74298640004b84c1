"""Where a feature drafter's first drafts fail: acceptance split by how sure the target itself is.

For each prompt set (the benchmark chat prompts, and held-out prompts of answers files) the target writes its
greedy answer in torch (fp32), then one teacher-forced pass gives, at every answer position, the target's own
next-token distribution p and its aux features; the head drafts depth 1 from them as it was trained (features at
q, embedding of x_{q+1}, predicting x_{q+2}). Positions are bucketed by the target's top-1 probability max(p):
if the head fails mostly where the target itself hesitates, the prompt set is intrinsically harder; if it fails on
positions the target is sure of, the head has not learnt that kind of text (more data of that kind helps).

Usage:
    python benchmarks/acceptance_by_confidence.py --target SmolLM2-135M-Instruct.Q4_1.gguf \
        --head models/smollm2-eagle3 \
        [--data models/smollm2-data/answers.npz ...] [--prompts 32] [--tokens 64] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.01)


def _answers(model, prompts: list[list[int]], tokens: int, stops: tuple[int, ...]) -> list[list[int]]:
    """Greedy answers (up to ``tokens`` ids, cut after the first stop token) of the target, batched (left padding:
    the teacher-forced pass, not these ids, defines the target's next-token distribution at every position)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), stops[0], dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    with torch.no_grad():
        g = model.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                           eos_token_id=list(stops), pad_token_id=stops[0])
    out = []
    for row in g[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        out.append(row[:cut])
    return out


def load_pair(target_path: Path, head_path: Path, threads: int):
    """(target, head in eval mode) with torch on ``threads`` threads."""
    import torch

    from edge_spec.distill.eagle import load_head
    from edge_spec.distill.target import load_target

    torch.set_num_threads(threads)
    target = load_target(target_path)
    return target, load_head(head_path, target.model.config.num_hidden_layers).eval()


def chat_prompt_ids(target, n: int) -> list[list[int]]:
    """The first ``n`` benchmark chat prompts (of the 96 held out; the first 32 are ``CHAT_PROMPTS``) rendered by
    the target's chat template."""
    from chat_prompts import ALL_CHAT_PROMPTS, chat_messages

    from edge_spec.distill.target import render

    return [render(target.tokenizer, chat_messages(p)) for p in ALL_CHAT_PROMPTS[:n]]


def depth1_logits(model, head, ids, feats):
    """[S-1, Vd] head logits of its first draft at every position q of ``ids`` [1, S]: features ``feats`` [1, S, 3H]
    at q and the embedding of x_{q+1}, predicting x_{q+2} (as it was trained)."""
    e = model.model.embed_tokens(ids[:, 1:])  # x_{q+1} for q = 0..S-2
    return head.forward_chain(e, feats[:, :-1], 1)[0][1][0]


def teacher_forced(target, head, prompts: list[list[int]], tokens: int, hidden_states: bool = False):
    """For each prompt, the target's greedy answer read back in one teacher-forced pass: yields (prompt ids, answer
    ids, ids [1, S] of both, the target's logits [S, V] in float32, the head's aux features [1, S, 3H], and with
    ``hidden_states`` transformers' per-layer residual streams (L + 1 of [1, S, H], the last after the final norm),
    else None)."""
    import torch

    from edge_spec.distill.target import aux_hooks

    model = target.model
    answers = _answers(model, prompts, tokens, target.stop_ids)
    store: dict[int, torch.Tensor] = {}
    handles = aux_hooks(model, head.c.aux_layers, store)
    try:
        for p, a in zip(prompts, answers):
            ids = torch.tensor([p + a])
            with torch.no_grad():
                out = model.model(input_ids=ids, use_cache=False, output_hidden_states=hidden_states)
                logits = model.lm_head(out.last_hidden_state)[0].float()
                yield p, a, ids, logits, torch.cat([store[j] for j in head.c.aux_layers], -1), out.hidden_states
    finally:
        for hd in handles:
            hd.remove()


def measure(target, head, prompts: list[list[int]], tokens: int) -> dict:
    """Per answer position: target top-1 probability, whether the head's depth-1 draft equals the target's argmax."""
    import torch

    conf, hit, top4, pos, inside = [], [], [], [], []
    d2t = head.draft_to_target
    for p, a, ids, target_logits, feats, _ in teacher_forced(target, head, prompts, tokens):
        with torch.no_grad():
            probs = torch.softmax(target_logits, -1)  # [S, V]
            logits = depth1_logits(target.model, head, ids, feats)
        drafts = d2t[logits.argmax(-1)]
        best4 = d2t[logits.topk(4, -1).indices]  # [S-1, 4]
        for j in range(len(p), len(p) + len(a)):  # answer token x_j, drafted at q = j - 2 from p at j - 1
            pj = probs[j - 1]
            conf.append(float(pj.max()))
            hit.append(bool(int(drafts[j - 2]) == int(pj.argmax())))
            top4.append(bool((best4[j - 2] == pj.argmax()).any()))
            inside.append(bool(head.t2d[pj.argmax()]))
            pos.append(j - len(p))
    conf_a, hit_a, top4_a, pos_a = np.array(conf), np.array(hit), np.array(top4), np.array(pos)
    rows = []
    for lo, hi in zip(BUCKETS[:-1], BUCKETS[1:]):
        m = (conf_a >= lo) & (conf_a < hi)
        rows.append({"top1_from": lo, "top1_to": min(hi, 1.0), "share": round(float(m.mean()), 4),
                     "acceptance": round(float(hit_a[m].mean()), 4) if m.any() else None})
    by_pos = []
    for lo, hi in ((0, 8), (8, 16), (16, 32), (32, 64), (64, 10 ** 6)):
        m = (pos_a >= lo) & (pos_a < hi)
        if m.any():
            by_pos.append({"from": lo, "to": hi, "acceptance": round(float(hit_a[m].mean()), 4),
                           "mean_top1": round(float(conf_a[m].mean()), 4)})
    return {"prompts": len(prompts), "positions": int(len(hit_a)), "acceptance": round(float(hit_a.mean()), 4),
            "in_head_top4": round(float(top4_a.mean()), 4), "in_draft_vocab": round(float(np.mean(inside)), 4),
            "mean_top1": round(float(conf_a.mean()), 4), "by_top1": rows, "by_position": by_pos}


def head_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments of the scripts that run a head on the target's chat answers in torch (this one,
    feature_source.py, head_precision.py): --target, --head, --prompts, --tokens, --threads, --json."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--head", required=True, type=Path, help="an EAGLE-3 head directory (edge-spec distill --out)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = head_arguments(__doc__)
    ap.add_argument("--data", type=Path, nargs="*", default=[], metavar="ANSWERS_NPZ",
                    help="answers files whose held-out prompts form the second set")
    args = ap.parse_args(argv)

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from distill_acceptance import answers_prompts

    t0 = time.time()
    target, head = load_pair(args.target, args.head, args.threads)
    sets = {"chat": chat_prompt_ids(target, args.prompts)}
    if args.data:
        sets["held-out of " + ", ".join(f.name for f in args.data)] = answers_prompts(args.data, args.prompts)
    report = {"target": str(args.target), "head": str(args.head), "tokens": args.tokens, "threads": args.threads,
              "torch": torch.__version__, "sets": {}}
    for name, prompts in sets.items():
        r = measure(target, head, prompts, args.tokens)
        report["sets"][name] = r
        print(f"{name}: {r['prompts']} prompts, {r['positions']} positions, depth-1 greedy acceptance "
              f"{r['acceptance']:.3f} (target's token in the head's top 4: {r['in_head_top4']:.3f}, in its "
              f"vocabulary: {r['in_draft_vocab']:.3f}), mean target top-1 probability {r['mean_top1']:.3f}")
        for row in r["by_top1"]:
            acc = "-" if row["acceptance"] is None else f"{row['acceptance']:.3f}"
            print(f"  target top-1 in [{row['top1_from']:.2f}, {row['top1_to']:.2f}): {row['share']:6.1%} of "
                  f"positions, acceptance {acc}")
        for row in r["by_position"]:
            print(f"  answer tokens {row['from']}-{row['to']}: acceptance {row['acceptance']:.3f}, mean top-1 "
                  f"{row['mean_top1']:.3f}")
    report["seconds"] = round(time.time() - t0, 1)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
