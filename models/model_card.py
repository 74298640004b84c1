"""Render models/demo/MODEL_CARD.md from the training report (training.json).

Usage: python models/model_card.py models/demo
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def compute_params(shape: dict, vocab: int) -> int:
    """Weights multiplied per token (attention + MLP + LM head; the embedding is a lookup)."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    head = h // shape["num_attention_heads"]
    attn = h * h * 2 + 2 * h * shape["num_key_value_heads"] * head
    return shape["num_hidden_layers"] * (attn + 3 * h * inter) + h * vocab


def render(report: dict, vocab: int = 8192) -> str:
    t, d, a, c = report["target"], report["drafter"], report["greedy_agreement"], report["corpus"]
    shape_keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads")
    tc, dc = compute_params(t, vocab), compute_params(d, vocab)
    shape_row = " / ".join(k.replace("num_", "").replace("_", " ") for k in shape_keys)
    t_shape = " / ".join(str(t[k]) for k in shape_keys)
    d_shape = " / ".join(str(d[k]) for k in shape_keys)
    d_steps = f"{d['steps']} pre-training + {d['distill_steps']} distillation"
    d_time = f"{d['train_seconds'] / 60:.1f} min (incl. generating the distillation text)"
    repro = (f"python models/train_demo.py --seed {report['seed']} --target-steps {t['steps']} "
             f"--drafter-steps {d['steps']} --distill-steps {d['distill_steps']} --out models/demo")
    return f"""# edge-spec demo pair (target + drafter)

Two small Llama-architecture causal LMs in Hugging Face format, made by this project so that
every edge-spec claim can be measured without downloading weights. They write Python-shaped
text; they are not useful code models.

| | target | drafter |
|---|---|---|
| architecture | LlamaForCausalLM | LlamaForCausalLM |
| parameters | {t['params']:,} | {d['params']:,} |
| per-token compute (weights multiplied: layers + LM head) | {tc:,} | {dc:,} ({dc / tc:.1%} of the target) |
| {shape_row} | {t_shape} | {d_shape} |
| training steps (batch 16 x 256 tokens) | {t['steps']} | {d_steps} |
| wall-clock training time | {t['train_seconds'] / 60:.1f} min | {d_time} |
| final training loss | {t['train_loss']} | {d['pretrain_loss']} (pre-training), {d['distill_loss']} (on target text) |
| held-out loss (2% of the corpus tokens) | {t['val_loss']} | {d['val_loss']} |
| weights | `target/model.safetensors` (fp16) | `drafter/model.safetensors` (fp16) |

**Greedy agreement** (share of positions where the drafter's argmax equals the target's, along
the target's own greedy continuation of {a['heldout_prompts']} held-out chat prompts,
{a['tokens_per_prompt']} tokens each; this is the per-token acceptance of greedy speculative
decoding): **{a['after_distill']:.1%}** after distillation ({a['before_distill']:.1%} after
pre-training only).

## Data

* Corpus: {c['files']} source files of the Python {c['python']} standard library (the list is in
  `corpus_files.txt`; tests, demos, `idlelib`, `lib2to3`, `encodings`, `pydoc_data` and files over
  300 kB left out), plus {c['chat_pairs']:,} chat-shaped pairs made from it (user: "Write a Python
  function that does this: <first paragraph of a docstring>", assistant: the function's code).
  sha256 of the corpus (paths and bytes, in order): `{c['sha256']}`. {c['tokens']:,} tokens.
  The Python standard library is under the PSF License Agreement; the weights inherit nothing
  else.
* Tokenizer: byte-level BPE, 8,192 tokens, trained on the same corpus with `tokenizers`;
  specials `<|endoftext|>` (EOS), `<|user|>`, `<|assistant|>`, `<|system|>`, `<|end|>` (end of
  turn). Chat template: `<|role|>\\ncontent<|end|>\\n` per message, `<|assistant|>\\n` as the
  generation prompt.

## Recipe (FastDraft)

1. Target: AdamW (lr 1.5e-3, cosine, warm-up 50), random 256-token windows in a seeded order.
2. Drafter: the same for pre-training (lr 3e-3).
3. The target answers 1,024 training prompts (half greedy, half sampled at T = 0.8, 128 tokens
   each); the drafter is fine-tuned on that text, so it learns the target's habits, not the
   corpus's.
4. Weights are rounded to fp16 before the agreement and loss are measured, so the numbers are
   those of the committed files.

The run used a wall-clock budget (`--minutes`), which turned into the step counts above on a
2-core machine that was busy with other work; the step counts reproduce the run exactly
(seeded data order and initialisation, CPU torch {report['torch']}):

```bash
{repro}
```

Total time of the recorded run: {report['total_minutes']} min. (The `--minutes` budget is
turned into step counts from the speed of the first steps of each stage; when other work shares
the cores afterwards, the run takes longer than the budget, never fewer steps.)

Reading the numbers: after distillation the drafter's loss on held-out *corpus* text rises
(pre-training: {d['pretrain_loss']}, held-out after distillation: {d['val_loss']}), because it
now imitates the target rather than the corpus; what speculative decoding needs is agreement with
the target, and that rises. The target itself is small and briefly trained (held-out loss
{t['val_loss']}): it produces plausible-looking Python, often repetitive.
"""


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent / "demo")
    report = json.loads((root / "training.json").read_text())
    (root / "MODEL_CARD.md").write_text(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
