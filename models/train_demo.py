"""Train the edge-spec demo pair on CPU: tokenizer, target, drafter (FastDraft recipe).

Stages, all deterministic given ``--seed`` and the step counts:

1. corpus   - Python standard-library sources + docstring->code chat pairs (models/corpus.py)
2. tokenizer- byte-level BPE with the demo chat template
3. target   - Llama, trained for ``--target-steps`` (or a share of ``--minutes``)
4. drafter  - small Llama, pre-trained on the corpus
5. distill  - the target generates answers to training prompts; the drafter is fine-tuned
              on that text (FastDraft: a drafter trained on target-generated text agrees
              with the target more often)
6. measure  - loss on held-out text, greedy agreement (teacher-forced on the target's own
              greedy continuations of held-out prompts), written to the model card.

A wall-clock budget picks the step counts; the card records them so that
``--target-steps/--drafter-steps/--distill-steps`` reproduces the run exactly.

Usage:  python models/train_demo.py --minutes 45 --out models/demo
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_mod  # noqa: E402
import model_card  # noqa: E402

SEQ_LEN = 256
BATCH = 16
VOCAB = 8192
TARGET_SHAPE = dict(hidden_size=256, num_hidden_layers=6, intermediate_size=768,
                    num_attention_heads=8, num_key_value_heads=4)
DRAFTER_SHAPE = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                     num_attention_heads=4, num_key_value_heads=2)
# Share of --minutes spent on each trained stage (generation of distillation data is timed
# inside the distill share).
SPLIT = {"target": 0.55, "drafter": 0.15, "distill": 0.30}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(docs: list[str], out: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=2, special_tokens=corpus_mod.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return tok


def write_hf_tokenizer_files(out: Path, tok: Tokenizer) -> None:
    """tokenizer_config.json / special_tokens_map.json as transformers expects them."""
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                  "rstrip": False, "single_word": False, "special": True}
        for t in corpus_mod.SPECIAL_TOKENS
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": corpus_mod.EOS,
        "pad_token": corpus_mod.EOS,
        "unk_token": None,
        "chat_template": corpus_mod.CHAT_TEMPLATE,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": corpus_mod.EOS, "pad_token": corpus_mod.EOS}, indent=2) + "\n")


# --------------------------------------------------------------------------- data
def encode_stream(tok: Tokenizer, docs: list[str]) -> np.ndarray:
    eos = tok.token_to_id(corpus_mod.EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def batches(stream: np.ndarray, seed: int):
    """Endless deterministic batches of random windows [BATCH, SEQ_LEN + 1]."""
    rng = np.random.default_rng(seed)
    hi = len(stream) - SEQ_LEN - 1
    while True:
        starts = rng.integers(0, hi, size=BATCH)
        yield torch.from_numpy(np.stack([stream[s : s + SEQ_LEN + 1] for s in starts]).astype(np.int64))


def make_model(shape: dict, tok: Tokenizer, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    eos = tok.token_to_id(corpus_mod.EOS)
    end = tok.token_to_id(corpus_mod.END)
    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=eos,
                      eos_token_id=[end, eos], pad_token_id=eos, **shape)
    return LlamaForCausalLM(cfg)


def train(model: LlamaForCausalLM, data, steps: int | None, seconds: float | None,
          lr: float, name: str, warmup: int = 50) -> tuple[int, float]:
    """Train until ``steps`` (exact, reproducible) or ``seconds`` (wall clock) run out.

    Returns (steps done, mean loss of the last 20 steps)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    # With a wall-clock budget the schedule length is estimated after 5 steps.
    planned = steps
    t0 = time.time()
    losses: list[float] = []
    step = 0
    model.train()
    while True:
        if planned is not None and step >= planned:
            break
        horizon = planned or 10_000
        scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / horizon, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        batch = next(data)
        out = model(input_ids=batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        if planned is None and step == 5 and seconds is not None:
            per = (time.time() - t0) / 5
            planned = max(10, int(seconds / per))
            log(f"{name}: {per:.2f} s/step -> {planned} steps in {seconds / 60:.1f} min")
        if step % 50 == 0:
            log(f"{name}: step {step}/{planned} loss {np.mean(losses[-50:]):.3f}")
    model.eval()
    return step, float(np.mean(losses[-20:]))


@torch.no_grad()
def eval_loss(model: LlamaForCausalLM, stream: np.ndarray, seed: int, n_batches: int = 8) -> float:
    data = batches(stream, seed)
    losses = []
    for _ in range(n_batches):
        b = next(data)
        logits = model(input_ids=b[:, :-1]).logits
        losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), b[:, 1:].reshape(-1)).item())
    return float(np.mean(losses))


# --------------------------------------------------------------------------- distillation
@torch.no_grad()
def generate(model: LlamaForCausalLM, prompts: list[list[int]], new_tokens: int, sample: bool,
             seed: int, batch: int = 32) -> list[list[int]]:
    """Target continuations (token ids, prompt excluded); left-padded batched decoding."""
    torch.manual_seed(seed)
    outs = []
    pad = model.config.pad_token_id
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=sample, temperature=0.8 if sample else None,
                             top_k=None, top_p=None, pad_token_id=pad)
        outs.extend(g[width:].tolist() for g in gen)
    return outs


@torch.no_grad()
def greedy_agreement(target: LlamaForCausalLM, drafter: LlamaForCausalLM,
                     prompts: list[list[int]], new_tokens: int) -> float:
    """Share of positions where argmax(q) == argmax(p) along the target's greedy path.

    This is the per-token acceptance rate of greedy speculative decoding."""
    conts = generate(target, prompts, new_tokens, sample=False, seed=0)
    hits = total = 0
    for p, c in zip(prompts, conts):
        seq = torch.tensor([p + c])
        tp = target(input_ids=seq).logits[0, len(p) - 1 : -1].argmax(-1)
        dq = drafter(input_ids=seq).logits[0, len(p) - 1 : -1].argmax(-1)
        hits += int((tp == dq).sum())
        total += len(c)
    return hits / max(total, 1)


def compute_params(model: LlamaForCausalLM) -> int:
    """Weights multiplied per token: everything but the embedding lookup (LM head included)."""
    return sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)


def fp16_roundtrip(model: LlamaForCausalLM) -> None:
    """Apply the precision the weights are committed in, so measurements match the files."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "demo")
    ap.add_argument("--minutes", type=float, default=45.0, help="wall-clock budget for all training stages")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--target-steps", type=int, help="exact step count (overrides --minutes)")
    ap.add_argument("--drafter-steps", type=int)
    ap.add_argument("--distill-steps", type=int)
    ap.add_argument("--distill-prompts", type=int, default=1024, help="target generations used for distillation")
    ap.add_argument("--max-files", type=int, help="use only the first N corpus files (tests)")
    ap.add_argument("--heldout", type=int, default=64, help="held-out chat prompts for the agreement measurement")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    t_start = time.time()

    log("corpus: reading the standard library sources")
    corpus = corpus_mod.build_corpus()
    if args.max_files:
        corpus = corpus_mod.Corpus(corpus.files[: args.max_files], corpus.sha256,
                                   corpus.code_docs[: args.max_files], corpus.chat_pairs[: 20 * args.max_files])
    train_pairs, held_pairs = corpus_mod.split_pairs(corpus, n_heldout=args.heldout, seed=args.seed)
    docs = corpus_mod.training_documents(corpus, train_pairs, args.seed)
    log(f"corpus: {len(corpus.files)} files, {len(corpus.chat_pairs)} chat pairs, sha256 {corpus.sha256[:16]}")

    tok_dir = args.out / "tokenizer"
    tok = train_tokenizer(docs, tok_dir)
    stream = encode_stream(tok, docs)
    split = int(len(stream) * 0.98)
    train_stream, val_stream = stream[:split], stream[split:]
    log(f"tokenizer: {tok.get_vocab_size()} tokens; corpus = {len(stream):,} tokens")

    budget = args.minutes * 60
    target = make_model(TARGET_SHAPE, tok, args.seed)
    t0 = time.time()
    t_steps, t_loss = train(target, batches(train_stream, args.seed), args.target_steps,
                            budget * SPLIT["target"], 1.5e-3, "target")
    t_time = time.time() - t0
    fp16_roundtrip(target)

    drafter = make_model(DRAFTER_SHAPE, tok, args.seed + 1)
    t0 = time.time()
    d_steps, d_loss = train(drafter, batches(train_stream, args.seed + 2), args.drafter_steps,
                            budget * SPLIT["drafter"], 3e-3, "drafter")
    d_time = time.time() - t0

    held_prompts = [tok.encode(corpus_mod.render_chat(p, None)).ids[-192:] for p, _ in held_pairs]
    fp16_roundtrip(drafter)
    agree_before = greedy_agreement(target, drafter, held_prompts, 64)
    log(f"greedy agreement before distillation: {agree_before:.3f}")

    # FastDraft: the target writes the fine-tuning text for the drafter.
    t0 = time.time()
    rng = np.random.default_rng(args.seed + 3)
    pick = rng.choice(len(train_pairs), size=min(args.distill_prompts, len(train_pairs)), replace=False)
    prompts = [tok.encode(corpus_mod.render_chat(train_pairs[i][0], None)).ids[-128:] for i in pick]
    half = len(prompts) // 2
    conts = generate(target, prompts[:half], 128, sample=False, seed=args.seed) + \
        generate(target, prompts[half:], 128, sample=True, seed=args.seed)
    distill_ids = []
    for p, c in zip(prompts, conts):
        distill_ids.extend(p + c)
        distill_ids.append(tok.token_to_id(corpus_mod.EOS))
    distill_stream = np.asarray(distill_ids, dtype=np.int32)
    gen_time = time.time() - t0
    log(f"distill: target generated {len(prompts)} answers ({len(distill_stream):,} tokens) in {gen_time:.0f}s")
    remaining = None if args.distill_steps else max(30.0, budget * SPLIT["distill"] - gen_time)
    t0 = time.time()
    k_steps, k_loss = train(drafter, batches(distill_stream, args.seed + 4), args.distill_steps,
                            remaining, 1e-3, "distill", warmup=10)
    k_time = time.time() - t0
    fp16_roundtrip(drafter)
    agree_after = greedy_agreement(target, drafter, held_prompts, 64)
    log(f"greedy agreement after distillation: {agree_after:.3f}")

    results = {
        "seed": args.seed,
        "corpus": {"files": len(corpus.files), "chat_pairs": len(corpus.chat_pairs),
                   "sha256": corpus.sha256, "tokens": int(len(stream)),
                   "python": platform.python_version()},
        "target": {"params": sum(p.numel() for p in target.parameters()),
                   "compute_params": compute_params(target), "steps": t_steps,
                   "train_seconds": round(t_time), "train_loss": round(t_loss, 3),
                   "val_loss": round(eval_loss(target, val_stream, 99), 3), **TARGET_SHAPE},
        "drafter": {"params": sum(p.numel() for p in drafter.parameters()),
                    "compute_params": compute_params(drafter), "steps": d_steps,
                    "distill_steps": k_steps, "train_seconds": round(d_time + gen_time + k_time),
                    "pretrain_loss": round(d_loss, 3), "distill_loss": round(k_loss, 3),
                    "val_loss": round(eval_loss(drafter, val_stream, 99), 3), **DRAFTER_SHAPE},
        "greedy_agreement": {"before_distill": round(agree_before, 4), "after_distill": round(agree_after, 4),
                             "heldout_prompts": len(held_prompts), "tokens_per_prompt": 64},
        "total_minutes": round((time.time() - t_start) / 60, 1),
        "torch": torch.__version__,
    }
    for name, model in (("target", target), ("drafter", drafter)):
        d = args.out / name
        model.to(torch.float16).save_pretrained(d, safe_serialization=True)
        model.generation_config.save_pretrained(d)
        write_hf_tokenizer_files(d, tok)
    (args.out / "training.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "corpus_files.txt").write_text("\n".join(corpus.files) + "\n")
    (args.out / "MODEL_CARD.md").write_text(model_card.render(results))
    log(f"done: {json.dumps(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
