"""Does an EAGLE-3 head fit the text it was trained on better than held-out text? (underfitting vs. data).

Depth-1..4 acceptance proxies in torch (as ``edge-spec distill`` reports them: greedy = the head's top-1 equals the
target's, T=0.7 = E[sum min(p, q)]) on a seeded sample of an answers file's TRAINING conversations and on its
held-out ones. A head short of data fits its training text far better than held-out text; a head that fits both
about equally is limited by its capacity or its optimisation, and more data of the same kind will not lift it.
Features and the teacher's top-32 come from ``--features`` (the shared directory of ``distill --features``), computed
there when missing.

    python benchmarks/probes/head_fit.py --target SmolLM2-135M-Instruct.Q4_1.gguf --head models/smollm2-eagle3 \
        --data models/smollm2-data/answers-s5.npz --features FEATURES_DIR [--sequences 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--head", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path, help="an answers file the head was trained on")
    ap.add_argument("--features", required=True, type=Path)
    ap.add_argument("--sequences", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import torch

    from edge_spec.distill.eagle import load_head
    from edge_spec.distill.eagle_train import EagleTrainConfig, evaluate, target_to_draft
    from edge_spec.distill.features import extract_features
    from edge_spec.distill.ids import read
    from edge_spec.distill.target import load_target

    torch.set_num_threads(args.threads)
    tgt = load_target(args.target)
    head = load_head(args.head, tgt.model.config.num_hidden_layers).eval()
    t2d = target_to_draft(head)
    train, held, _ = read(args.data)
    pick = np.sort(np.random.default_rng(0).choice(len(train), min(args.sequences, len(train)), replace=False))
    cfg = EagleTrainConfig()
    rows = {}
    for name, seqs in (("training", [train[i] for i in pick]), ("held-out", held[:args.sequences])):
        store = extract_features(tgt.model, seqs, tuple(head.c.aux_layers), args.features, cfg.max_len,
                                 log=lambda _: None, teacher_top_k=32, target_sha256=tgt.sha256, shared=True,
                                 bf16=True)
        ev = evaluate(head, tgt.model.model.embed_tokens, seqs, store, 0, t2d, torch.ones(store.dim), cfg)
        rows[name] = {"sequences": len(seqs), **ev}
        print(f"{name}: {len(seqs)} conversations, greedy by depth {ev['greedy']} ({ev['greedy_positions']} "
              f"positions), T=0.7 {ev['t07']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"head": str(args.head), "data": str(args.data), **rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
