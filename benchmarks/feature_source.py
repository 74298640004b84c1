"""What the head loses between training and the bundle: torch features and teacher vs the exported graph's.

A head is trained on the torch target's aux features against the torch target's distribution; in the runtime it
reads the exported target graph's features (int8 activations, fp16 output) and is judged against that graph's
argmax. On the same text (the torch target's greedy answers to the benchmark chat prompts), one teacher-forced
pass of each gives features and argmax at every answer position, and the head drafts depth 1 (features at q,
embedding of x_{q+1}, predicting x_{q+2}) from either source, judged against either argmax:

    features torch / ORT  x  target argmax torch / ORT

The diagonal torch/torch is what training optimises; ORT/ORT is what the bundle sees. If ORT/ORT trails
torch/torch mostly through the argmax (torch features judged against ORT's argmax score as low), the head should
learn the graph's own distribution; if through the features, the graph's features.

    python benchmarks/feature_source.py --target SmolLM2-135M-Instruct.Q4_1.gguf --bundle DEMO \
        --head models/smollm2-eagle3 --prompts 32 --tokens 64 --threads 2
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def ort_pass(session, spec: dict, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(argmax [S], features [S, n_aux * H] float32) of one teacher-forced pass of the exported target graph."""
    t = spec["target"]
    names = t["input_names"]
    feeds = {names["input_ids"]: np.array([ids], np.int64),
             names["attention_mask"]: np.ones((1, len(ids)), np.int64)}
    kv = np.zeros((1, t["num_kv_heads"], 0, t["head_size"]), np.float16 if t["quantization"]["kv_dtype"] == "float16"
                  else np.float32)
    for i in range(t["num_layers"]):
        feeds[names["past_key"] % i] = kv
        feeds[names["past_value"] % i] = kv
    out = t["output_names"]
    logits, hidden = session.run([out["logits"], out["hidden_states"]], feeds)
    return logits[0].argmax(-1), hidden[0].astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from acceptance_by_confidence import chat_prompt_ids, depth1_logits, head_arguments, load_pair, teacher_forced

    ap = head_arguments(__doc__)
    ap.add_argument("--bundle", required=True, type=Path)
    args = ap.parse_args(argv)

    import onnxruntime as ort
    import torch

    t0 = time.time()
    spec = json.loads((args.bundle / "edge_spec.json").read_text())
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(args.bundle / spec["target"]["graph"]), so, providers=["CPUExecutionProvider"])
    target, head = load_pair(args.target, args.head, args.threads)
    model = target.model
    d2t = head.draft_to_target
    prompts = chat_prompt_ids(target, args.prompts)
    hits = {f"{f}/{a}": [] for f in ("torch", "ort") for a in ("torch", "ort")}
    agree, rel = [], []
    for p, a, ids, logits, torch_feats, _ in teacher_forced(target, head, prompts, args.tokens):
        seq = p + a
        arg = {"torch": logits.argmax(-1).numpy()}
        feats = {"torch": torch_feats[0].float()}
        arg["ort"], f_ort = ort_pass(session, spec, seq)
        feats["ort"] = torch.from_numpy(f_ort)
        x, y = feats["torch"].numpy(), f_ort
        rel.append(float(np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2))))
        with torch.no_grad():
            drafts = {f: d2t[depth1_logits(model, head, ids, fx[None]).argmax(-1)].numpy()
                      for f, fx in feats.items()}
        for j in range(len(p), len(seq)):  # answer token x_j: target argmax at j - 1, drafted at q = j - 2
            agree.append(arg["torch"][j - 1] == arg["ort"][j - 1])
            for f in feats:
                for s in arg:
                    hits[f"{f}/{s}"].append(drafts[f][j - 2] == arg[s][j - 1])
    res = {k: round(float(np.mean(v)), 4) for k, v in hits.items()}
    report = {"command": "python benchmarks/feature_source.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "prompts": len(prompts), "positions": len(agree),
              "depth1_acceptance_features_over_argmax": res,
              "argmax_torch_equals_ort": round(float(np.mean(agree)), 4),
              "feature_rel_rms_error_mean": round(float(np.mean(rel)), 4), "seconds": round(time.time() - t0, 1)}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
