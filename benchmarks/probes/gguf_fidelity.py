"""GGUF fidelity: our graphs of a GGUF file vs transformers fp32 on the same (dequantized) file.

For each configuration ``MODE:LEVEL`` (``--gguf-mode`` and accuracy level) it builds the target graph with
:mod:`edge_spec.export.own_build` and reports, over chat prompts rendered with the GGUF's own template:

* greedy agreement: first ``--tokens`` greedy tokens identical to transformers' (count and mean common prefix);
* max |Δlogit| on the reference sequences (teacher-forced, one pass);
* median 1-token step time (2 threads, KV shared past/present as the runtime binds it);
* max |k-token pass − k 1-token passes| for k = 2, 4, 8 (0 means bit-identical verify passes).

``python benchmarks/probes/gguf_fidelity.py --gguf /work/smollm2.gguf --configs exact:1 fast:4 --prompts 30``
Transformers' references are cached next to ``--out`` (they take minutes on a small CPU).
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import numpy as np

PROMPTS = [
    "What is the capital of France?", "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.", "Give me three tips for better sleep.", "What is 17 times 23?",
    "Translate 'good morning' into Spanish.", "Who wrote Romeo and Juliet?", "List the planets of the solar system.",
    "What does HTTP stand for?", "Summarize the plot of Cinderella.", "How do I make a cup of tea?",
    "What is the difference between a list and a tuple in Python?", "Why is the sky blue?",
    "Write a haiku about autumn.", "What are the primary colors?", "Explain what a black hole is.",
    "Give me a recipe for pancakes.", "What is machine learning?", "How many days are in a leap year?",
    "Name three famous painters.", "What is the boiling point of water?", "Write a short poem about the sea.",
    "How does a bicycle work?", "What is the largest ocean on Earth?", "Explain recursion to a child.",
    "What should I pack for a beach trip?", "Who was Albert Einstein?", "What is a prime number?",
    "Suggest a name for a pet cat.", "How do vaccines work?",
]


def references(gguf: Path, prompts: list[str], n: int, cache: Path) -> list[tuple[list[int], list[int], np.ndarray]]:
    """(prompt ids, transformers' greedy continuation, its fp32 logits over prompt + continuation) per prompt."""
    if cache.is_file():
        refs = pickle.loads(cache.read_bytes())
        if len(refs) >= len(prompts):
            return refs[: len(prompts)]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    refs = []
    for p in prompts:
        enc = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
            gen = out[0, len(ids):].tolist()
            full = hf(torch.tensor([ids + gen])).logits[0].numpy()
        refs.append((ids, gen, full))
        print(f"  transformers: {len(refs)}/{len(prompts)}", flush=True)
    cache.write_bytes(pickle.dumps(refs))
    return refs


def evaluate(graph: Path, head: int, refs: list, n: int, eos: set[int]) -> dict[str, object]:
    from edge_spec.export.measure import Decoder

    dec = Decoder(graph, 512, head, threads=2)
    same, prefix, max_d = 0, [], 0.0
    for ids, gen, full in refs:
        max_d = max(max_d, float(np.abs(dec.forward(ids + gen, 0) - full).max()))
        lg, pos, out = dec.forward(ids, 0), len(ids), []
        for _ in range(n):
            t = int(lg[-1].argmax())
            out.append(t)
            if t in eos:
                break
            lg, pos = dec.forward([t], pos), pos + 1
        same += out == gen
        prefix.append(next((i for i, (a, b) in enumerate(zip(out, gen)) if a != b), min(len(out), len(gen))))
    ids = refs[0][0]
    dec.forward(ids, 0)
    steps = []
    for i in range(40):
        t0 = time.perf_counter()
        dec.forward([100 + i], len(ids) + i)
        steps.append(time.perf_counter() - t0)
    drift = {}
    base, toks = refs[1][0], refs[1][1]
    for k in (2, 4, 8):
        dec.forward(base, 0)
        multi = dec.forward(toks[:k], len(base)).copy()
        dec.forward(base, 0)
        single = np.stack([dec.forward([t], len(base) + j)[0] for j, t in enumerate(toks[:k])])
        drift[k] = float(np.abs(multi - single).max())
    return {"identical": f"{same}/{len(refs)}", "mean_common_prefix": round(float(np.mean(prefix)), 2),
            "max_abs_dlogit": max_d, "step_ms_median": round(1000 * float(np.median(steps)), 2),
            "k_pass_vs_1_token_passes_max_diff": drift}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--configs", nargs="+", default=["exact:1", "fast:4"], metavar="MODE:LEVEL")
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("gguf_fidelity"))
    args = ap.parse_args()
    from edge_spec.export import gguf, own_build

    args.out.mkdir(parents=True, exist_ok=True)
    refs = references(args.gguf, PROMPTS[: args.prompts], args.tokens, args.out / "transformers_refs.pkl")
    src = own_build.gguf_source(str(args.gguf), "target")
    eos = set(gguf.end_of_turn_ids(src.gguf))
    results = {}
    for cfg in args.configs:
        mode, level = cfg.split(":")
        t0 = time.perf_counter()
        graph = own_build.build(src, args.out / cfg.replace(":", "_"), 512, int(level), mode=mode)
        r = {"build_s": round(time.perf_counter() - t0, 1),
             "graph_bytes": sum(p.stat().st_size for p in graph.parent.iterdir()),
             "exact_tensors": f"{sum(e['exact'] for e in src.report)}/{len(src.report)}",
             **evaluate(graph, int(src.config["head_dim"]), refs, args.tokens, eos)}
        results[cfg] = r
        print(cfg, json.dumps(r), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
