"""Distill's feature pass (EAGLE-3 on ``--data``) in float32 vs under bfloat16 autocast: positions/s and agreement.

The same sequences of an answers file (the first ``--sequences`` training conversations) go through
``features.extract_features`` once per precision and round, alternating within one process so the machine's
drift hits both, each into a fresh directory (nothing reused). Then the bf16 pass is compared with the float32
one: the features' relative RMS error per aux layer, and the teacher targets training reads (top-1 id equal, the
top-32 sets' overlap, logsumexp difference at T = 1).

    python benchmarks/feature_pass_precision.py --target SmolLM2-135M-Instruct.Q4_1.gguf \
        --data models/smollm2-data/answers-s2.npz --sequences 192 --rounds 2 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, type=Path, help="GGUF file or HF checkpoint directory")
    ap.add_argument("--data", required=True, type=Path, help="an answers.npz of that target")
    ap.add_argument("--sequences", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=320)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "feature_pass_precision.json")
    args = ap.parse_args(argv)

    import torch

    from edge_spec.distill import ids
    from edge_spec.distill.eagle_run import our_aux_layers
    from edge_spec.distill.features import extract_features
    from edge_spec.distill.target import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target, "cpu")
    model = target.model
    aux = our_aux_layers(model.config.num_hidden_layers)
    hidden = model.config.hidden_size
    rate: dict[str, list[float]] = {"fp32": [], "bf16": []}
    kept: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"):
                train, _, _ = ids.read_many([args.data])
                seqs = train[:args.sequences]
                t0 = time.perf_counter()
                store = extract_features(model, seqs, aux, Path(tmp) / f"{name}{r}", args.max_len, lambda _m: None,
                                         teacher_top_k=32, target_sha256=target.sha256, bf16=name == "bf16")
                dt = time.perf_counter() - t0
                rate[name].append(store.rows / dt)
                print(f"round {r + 1} {name}: {store.rows:,} positions in {dt:.1f} s, {store.rows / dt:,.0f} pos/s",
                      flush=True)
                if r == 0:
                    feats = np.concatenate([store.get(i, args.max_len) for i in range(len(seqs))]).astype(np.float32)
                    kept[name] = (feats, seqs)
    (fa, sa), (fb, sb) = kept["fp32"], kept["bf16"]
    rel = []
    for j in range(len(aux)):
        a, b = fa[:, j * hidden:(j + 1) * hidden], fb[:, j * hidden:(j + 1) * hidden]
        rel.append(float(np.sqrt(np.mean((a - b) ** 2) / np.mean(a ** 2))))
    ta, tb = np.concatenate([s.topk_ids for s in sa]), np.concatenate([s.topk_ids for s in sb])
    top1 = float(np.mean(ta[:, 0] == tb[:, 0]))
    overlap = float(np.mean([len(set(x) & set(y)) / len(x) for x, y in zip(ta, tb)]))
    lse = np.abs(np.concatenate([s.lse[:, 0] for s in sa]) - np.concatenate([s.lse[:, 0] for s in sb]))
    mean = {k: float(np.mean(v)) for k, v in rate.items()}
    result = {
        "command": "python benchmarks/feature_pass_precision.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
        "threads": args.threads, "aux_layers": list(aux), "positions": int(fa.shape[0]),
        "pos_per_s": rate, "mean_pos_per_s": mean, "bf16_over_fp32": mean["bf16"] / mean["fp32"],
        "feature_rel_rms_error_by_aux": rel, "teacher_top1_equal": top1, "teacher_top32_overlap": overlap,
        "teacher_answer_rows": int(len(ta)), "lse_abs_diff_mean": float(lse.mean()),
        "lse_abs_diff_max": float(lse.max()),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "pos_per_s"}, indent=1))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
