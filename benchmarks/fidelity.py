"""Fidelity to the source model: greedy tokens of edge-spec bundles and llama.cpp vs transformers fp32.

The reference is transformers in float32 on the GGUF's own dequantized weights
(``from_pretrained(dir, gguf_file=...)``) — the model the file describes, computed as exactly as
we can. Each system gets the same prompt token ids (``apply_chat_template``) and decodes
greedily; we compare the first ``--tokens`` generated ids (each sequence cut after its first
stop token) and the first step's logits.

    python benchmarks/fidelity.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --bundle exact=BUNDLE_A --bundle fast=BUNDLE_B [--llamacpp] [--out results.json]

Reports, per system: prompts with identical tokens, mean common-prefix length, max |Δlogit|.
A benchmark, not a test: it needs the real model and (for --llamacpp) a llama.cpp build.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.lib.prompts import CHAT_PROMPTS, chat_messages  # noqa: E402


def _cut(ids: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in stops:
            return ids[: i + 1]
    return ids


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _sha(path: Path) -> str:
    from edge_spec.fetch import file_sha256

    return file_sha256(path)


def reference(gguf: Path, prompts: list[str], tokens: int) -> tuple[list[list[int]], list[list[int]], list[np.ndarray]]:
    """transformers fp32: (prompt ids, greedy ids, first-step logits) per prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    prompt_ids, outs, first = [], [], []
    for p in prompts:
        enc = tok.apply_chat_template(chat_messages(p), add_generation_prompt=True, tokenize=True)
        ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        prompt_ids.append(ids)
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
            first.append(logits.numpy().astype(np.float32))
            gen = []
            for _ in range(tokens):
                nxt = int(torch.argmax(logits))
                gen.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1]
        outs.append(gen)
    return prompt_ids, outs, first


def edge(bundle: Path, prompt_ids: list[list[int]], tokens: int) -> tuple[list[list[int]], list[np.ndarray], set[int]]:
    """edge-spec target alone (no drafting): greedy ids and first-step logits per prompt."""
    from edge_spec import Engine

    eng = Engine.load(bundle, drafting="none")
    stops = set(eng.manifest.tokenizer.stop_token_ids)
    outs, first = [], []
    for ids in prompt_ids:
        eng.reset()
        t = eng.target
        t.rewind_to(0)
        logits = None
        for s in range(0, len(ids), t.max_rows):
            logits = t.forward(ids[s:s + t.max_rows])
        first.append(np.array(logits[-1], dtype=np.float32))
        t.rewind_to(0)
        eng.reset()
        res = eng.generate(ids, {"max_new_tokens": tokens, "temperature": 0.0, "speculative": False,
                                 "stop_token_ids": ()})
        outs.append(list(res.token_ids))
    return outs, first, stops


def llamacpp(gguf: Path, prompt_ids: list[list[int]], tokens: int) -> list[list[int]]:
    from benchmarks.lib.llamacpp import LlamaServer

    outs = []
    with LlamaServer(gguf, threads=2, context=2048) as srv:
        for ids in prompt_ids:
            r = srv.complete(ids, tokens, temperature=0.0, extra={"ignore_eos": True})
            outs.append([int(t) for t in r["tokens"]])
    return outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--bundle", action="append", default=[], metavar="NAME=DIR", help="edge-spec bundle to compare")
    ap.add_argument("--llamacpp", action="store_true", help="also run llama.cpp's server on the same GGUF")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(CHAT_PROMPTS))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--reference-cache", type=Path, help="JSON file keeping the transformers reference between runs")
    args = ap.parse_args()
    prompts = list(CHAT_PROMPTS[: args.prompts])
    t0 = time.time()
    cache = args.reference_cache
    if cache is not None and cache.is_file():  # the reference is slow (minutes) and deterministic: reuse it
        data = json.loads(cache.read_text())
        if data["gguf_sha256"] != _sha(args.gguf) or data["prompts"] != prompts or data["tokens"] != args.tokens:
            sys.exit(f"{cache} was made for another GGUF, prompt set or token count; delete it to recompute.")
        prompt_ids, ref = data["prompt_ids"], data["ref"]
        ref_first = [np.array(f, dtype=np.float32) for f in data["ref_first"]]
    else:
        prompt_ids, ref, ref_first = reference(args.gguf, prompts, args.tokens)
        if cache is not None:
            cache.write_text(json.dumps({"gguf_sha256": _sha(args.gguf), "prompts": prompts, "tokens": args.tokens,
                                         "prompt_ids": prompt_ids, "ref": ref,
                                         "ref_first": [f.tolist() for f in ref_first]}))
    print(f"reference (transformers fp32) ready in {time.time() - t0:.0f}s", file=sys.stderr)
    systems: dict[str, tuple[list[list[int]], list[np.ndarray] | None]] = {}
    stops: set[int] = set()
    for spec in args.bundle:
        name, _, path = spec.partition("=")
        outs, first, stops = edge(Path(path), prompt_ids, args.tokens)
        systems[f"edge-spec {name}"] = (outs, first)
    if args.llamacpp:
        systems["llama.cpp"] = (llamacpp(args.gguf, prompt_ids, args.tokens), None)
    if not stops:
        from transformers import AutoTokenizer

        stops = {AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name).eos_token_id}
    refc = [_cut(r, stops) for r in ref]
    rows = []
    for name, (outs, first) in systems.items():
        cut = [_cut(o, stops) for o in outs]
        same = sum(a == b for a, b in zip(cut, refc))
        prefix = float(np.mean([_prefix(a, b) for a, b in zip(cut, refc)]))
        dlogit = max(float(np.max(np.abs(f - r))) for f, r in zip(first, ref_first)) if first else None
        rows.append({"system": name, "identical": same, "prompts": len(prompts), "mean_common_prefix": prefix,
                     "max_abs_dlogit_first_step": dlogit})
    print(f"\nFirst {args.tokens} greedy tokens vs transformers fp32 on the dequantized GGUF, {len(prompts)} prompts")
    print("| system | identical | mean common prefix | max |Δlogit| (first step) |\n|---|---:|---:|---:|")
    for r in rows:
        d = "—" if r["max_abs_dlogit_first_step"] is None else f"{r['max_abs_dlogit_first_step']:.4f}"
        print(f"| {r['system']} | {r['identical']}/{r['prompts']} | {r['mean_common_prefix']:.1f} | {d} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"gguf": str(args.gguf), "tokens": args.tokens, "rows": rows,
                                        "date": time.strftime("%Y-%m-%d")}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
