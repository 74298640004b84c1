"""Grow the demo target into a memory-bound bench target that computes the same function.

The demo target (hidden 256, 6 layers, 8 heads / 4 KV heads of 32, MLP 768) is too small
for speculation to pay on a CPU: its decode step is dominated by fixed per-step overhead,
not by reading weights. The bench target has the weight and KV-cache bytes of a
SmolLM-135M-shaped model (hidden 576, 30 layers, MLP 1536, 576-wide attention with a
192-wide K/V) but still computes the demo target's function, so the demo drafter keeps
its acceptance rate and benchmarks on it measure speed, not drafting quality.

How the embedding stays exact
-----------------------------
* Residual stream: the original 256 coordinates are coordinates 0..255 of the new 576;
  the other 320 are (near) zero.
* RMSNorm: over 576 coordinates of a vector that lives in 256 of them, the mean square is
  256/576 of the original, so the normalised vector is sqrt(576/256) = 1.5 times larger.
  The norm weights on the original coordinates are divided by 1.5 and ``rms_norm_eps`` is
  multiplied by 256/576, which makes every norm output identical (eps included).
* Attention: SmolLM-135M uses 9 heads / 3 KV heads of 64. A 32-wide head cannot be placed
  inside a 64-wide one exactly under RoPE *and* GQA (4 original KV heads do not fit 3), so
  the bench target uses 18 heads / 6 KV heads of 32 instead: the same projection shapes
  (576x576 for Q and O, 576x192 for K and V), the same KV bytes per token, the same weight
  bytes. Original query head h goes to new head 3*(h//2) + h%2 and original KV head g to
  new KV head g, so every query head still reads its own KV head (group size 2 -> 3).
* MLP: the original 768 channels are channels 0..767 of the new 1536.
* Inert parts (the 24 added layers, the extra heads and MLP channels, the extra
  embedding coordinates): input-side weights are ordinary random weights (std 0.02);
  output-side weights (o_proj, down_proj, embedding rows beyond 256) are random at
  ``inert_scale`` x 0.02. They are real, non-zero tensors — quantised, stored and read
  every step like any other weight, and no graph optimiser can prove them away — but
  they move the residual stream by ~1e-6, far below the fp32 logits tolerance we check.

Run::

    python benchmarks/lib/bench_target.py --src models/demo/target --out benchmarks/out/bench_target

The output is an HF checkpoint (fp32 safetensors, so the inert weights do not underflow
as fp16 would) plus the tokenizer files; the result is a pure function of the source
weights and ``--seed``. ``--check`` compares logits and greedy continuations of source
and result in torch.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 576, 30, 18, 6, 32, 1536
INIT_STD = 0.02
CHECK_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\nclass ",
    "<|user|>\nReturn the number of items in the queue.<|end|>\n<|assistant|>\n",
    "    for key, value in sorted(",
)


def _q_head(h: int) -> int:
    """New index of original query head h (original GQA group 2 -> new group 3)."""
    return 3 * (h // 2) + h % 2


def grow(src: Path, out: Path, layers: int = LAYERS, inert_scale: float = 1e-5, seed: int = 0) -> dict:
    """Write the bench checkpoint to ``out``; returns its config dict."""
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    h0, l0 = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh0, nkv0 = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd0, i0 = cfg.get("head_dim") or h0 // nh0, cfg["intermediate_size"]
    if hd0 != HEAD_DIM or nh0 % nkv0 or nh0 // nkv0 != 2 or nkv0 > KV_HEADS or h0 > HIDDEN or i0 > INTER:
        raise SystemExit(f"make_bench_target expects the demo target's shapes (head_dim 32, GQA group 2); got {cfg}")
    if cfg.get("tie_word_embeddings"):
        raise SystemExit("make_bench_target expects an untied LM head")
    if layers < l0:
        raise SystemExit(f"--layers must be >= the source's {l0}")
    scale = math.sqrt(HIDDEN / h0)  # RMSNorm over HIDDEN coords of a vector living in h0 of them

    sd = {k: v.float() for k, v in load_file(src / "model.safetensors").items()}
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = INIT_STD) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    tiny = INIT_STD * inert_scale
    new: dict[str, torch.Tensor] = {}

    emb = rand(sd["model.embed_tokens.weight"].shape[0], HIDDEN, std=tiny)
    emb[:, :h0] = sd["model.embed_tokens.weight"]
    new["model.embed_tokens.weight"] = emb
    head = rand(sd["lm_head.weight"].shape[0], HIDDEN)
    head[:, :h0] = sd["lm_head.weight"]
    new["lm_head.weight"] = head

    def norm_weight(orig: torch.Tensor | None) -> torch.Tensor:
        w = torch.ones(HIDDEN)
        if orig is not None:
            w[:h0] = orig / scale
        else:
            w /= scale
        return w

    new["model.norm.weight"] = norm_weight(sd["model.norm.weight"])

    for i in range(layers):
        p = f"model.layers.{i}."
        o = p if i < l0 else None  # first l0 layers carry the original ones, the rest are inert
        q = rand(HEADS * HEAD_DIM, HIDDEN)
        k = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        v = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        out_proj = rand(HIDDEN, HEADS * HEAD_DIM, std=tiny)
        gate, up = rand(INTER, HIDDEN), rand(INTER, HIDDEN)
        down = rand(HIDDEN, INTER, std=tiny)
        if o is not None:
            oq, ok, ov = (sd[o + f"self_attn.{n}_proj.weight"] for n in "qkv")
            oo = sd[o + "self_attn.o_proj.weight"]
            for h in range(nh0):
                src_rows, dst = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM), _q_head(h) * HEAD_DIM
                q[dst:dst + HEAD_DIM, :h0] = oq[src_rows]
                out_proj[:h0, dst:dst + HEAD_DIM] = oo[:, src_rows]
            k[:nkv0 * HEAD_DIM, :h0] = ok
            v[:nkv0 * HEAD_DIM, :h0] = ov
            gate[:i0, :h0] = sd[o + "mlp.gate_proj.weight"]
            up[:i0, :h0] = sd[o + "mlp.up_proj.weight"]
            down[:h0, :i0] = sd[o + "mlp.down_proj.weight"]
        new.update({
            p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": out_proj,
            p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": down,
            p + "input_layernorm.weight": norm_weight(sd[o + "input_layernorm.weight"] if o else None),
            p + "post_attention_layernorm.weight":
                norm_weight(sd[o + "post_attention_layernorm.weight"] if o else None),
        })

    new_cfg = dict(cfg)
    new_cfg.update(hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=HEADS,
                   num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=INTER,
                   rms_norm_eps=cfg["rms_norm_eps"] * h0 / HIDDEN, dtype="float32")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: t.contiguous() for k, t in sorted(new.items())}, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(new_cfg, indent=2, sort_keys=True) + "\n")
    for f in sorted(src.iterdir()):
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            shutil.copy2(f, tmp / f.name)
    (tmp / "BENCH_TARGET.json").write_text(json.dumps({
        "source": str(src), "seed": seed, "inert_scale": inert_scale, "layers": layers,
        "parameters": sum(t.numel() for t in new.values()),
        "original_layers": l0, "query_head_map": {h: _q_head(h) for h in range(nh0)},
    }, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return new_cfg


def check(src: Path, out: Path, new_tokens: int = 24) -> dict:
    """Max |logit difference| (fp32, full prompt) and greedy-continuation equality, source vs bench."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    a = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for prompt in CHECK_PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            la, lb = a(ids).logits, b(ids).logits
            ga = a.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
            gb = b.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
            rows.append({"prompt": prompt, "max_abs_logit_diff": float((la - lb).abs().max()),
                         "logit_scale": float(la.abs().max()), "greedy_equal": bool(torch.equal(ga, gb))})
    return {"prompts": rows, "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows),
            "greedy_equal": all(r["greedy_equal"] for r in rows),
            "parameters": {"source": sum(p.numel() for p in a.parameters()),
                           "bench": sum(p.numel() for p in b.parameters())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=Path("models/demo/target"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/bench_target"))
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--inert-scale", type=float, default=1e-5, help="output-side inert weights = this x 0.02 std")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare logits / greedy output with the source in torch")
    args = ap.parse_args(argv)
    grow(args.src, args.out, layers=args.layers, inert_scale=args.inert_scale, seed=args.seed)
    print(f"wrote {args.out}")
    if args.check:
        report = check(args.src, args.out)
        print(json.dumps(report, indent=2))
        (args.out / "CHECK.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
