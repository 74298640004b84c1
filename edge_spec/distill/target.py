"""Load the target a drafter is distilled from: a GGUF file or a Hugging Face checkpoint directory.

transformers dequantizes a GGUF file to fp32 on load (needs the ``gguf`` and ``accelerate`` packages),
so the drafter learns from the target's real weights as the GGUF holds them. The tokenizer and its
chat template come from the same file.

How distillation runs the loaded model, the same when it writes text (``data.py``) and when it recomputes
features (``features.py``): :func:`bf16_body` (its decoder in bfloat16, its LM head in float32) and
:func:`aux_hooks` (the residual streams an EAGLE-3 head reads, taken as the forward pass runs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from edge_spec.errors import EdgeSpecError


@dataclass
class Target:
    """A loaded target: fp32 model in eval mode, its tokenizer, identity and stop tokens."""

    model: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    path: Path
    sha256: str
    stop_ids: tuple[int, ...]


def file_sha256(path: Path) -> str:
    """sha256 of a file, or of a checkpoint directory's weight files (names and bytes, sorted)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf") and p.is_file())
    for f in files:
        if path.is_dir():
            h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _from_pretrained(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.is_file():
        if path.suffix != ".gguf":
            raise EdgeSpecError(f"--target '{path}' is a file but not a .gguf; pass a GGUF file or a Hugging Face "
                                "checkpoint directory.")
        kw = {"gguf_file": path.name}
        where = str(path.parent)
    else:
        kw, where = {}, str(path)
    tok = AutoTokenizer.from_pretrained(where, **kw)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw)
    return model, tok


def load_target(target: str | Path, device: str = "cpu") -> Target:
    """Load ``target`` (GGUF file or HF dir) in fp32 on ``device``; raise one sentence when it cannot be read."""
    path = Path(target)
    if not path.exists():
        raise EdgeSpecError(f"--target '{target}' does not exist; pass a GGUF file or a Hugging Face checkpoint "
                            "directory.")
    try:
        model, tok = _from_pretrained(path)
    except EdgeSpecError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise EdgeSpecError(f"Cannot load the target '{target}' with transformers ({exc.__class__.__name__}: "
                            f"{str(exc).splitlines()[0][:160]}); pass a GGUF file or a checkpoint directory that "
                            "transformers can read.") from None
    if getattr(tok, "chat_template", None) is None:
        raise EdgeSpecError(f"The target '{target}' has no chat template; distill needs a chat model whose "
                            "tokenizer defines one.")
    model.to(device).eval()
    stops: set[int] = set()
    for ids in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(ids, int):
            stops.add(ids)
        elif ids:
            stops.update(int(i) for i in ids)
    if not stops:
        raise EdgeSpecError(f"The target '{target}' defines no end-of-sequence token; distill needs one to know "
                            "where an answer ends.")
    return Target(model=model, tokenizer=tok, path=path, sha256=file_sha256(path), stop_ids=tuple(sorted(stops)))


def render(tok, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation as the target's own chat template renders it, ready for the assistant (or, with
    ``add_generation_prompt=False``, ending with its last message's turn)."""
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


@contextmanager
def bf16_body(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Run ``model``'s decoder matmuls under bfloat16 autocast and its LM head in float32.

    Why: on a CPU that multiplies bfloat16 natively, batched generation is ~1.6x faster (BENCHMARKS.md, "Writing
    the data in bfloat16"), and its greedy text agrees with float32's about as often as the exported graph's does;
    the head stays float32 so the logits (the teacher's top-k and logsumexp kept with the text) carry no bfloat16
    rounding of their own (~0.1 at a logit of 30). The residual stream stays float32 under autocast."""
    if not enabled:
        yield
        return
    head = model.get_output_embeddings()
    forward = head.forward
    own = "forward" in vars(head)  # already an instance attribute (e.g. an accelerate hook): put it back after

    def fp32_forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return forward(x.float())

    head.forward = fp32_forward  # an instance attribute over the class's method, removed below
    try:
        with torch.autocast(next(model.parameters()).device.type, torch.bfloat16):
            yield
    finally:
        if own:
            head.forward = forward
        else:
            del head.forward


def aux_hooks(model: torch.nn.Module, aux: tuple[int, ...], store: dict[int, torch.Tensor]) -> list:
    """Hooks that put the residual stream entering layer j (j = 0: the embeddings) into ``store[j]`` ([B, S, hidden]
    at each forward pass); the caller removes them."""
    handles = []
    for j in aux:
        mod = model.model.embed_tokens if j == 0 else model.model.layers[j - 1]

        def hook(_m, _inp, out, j=j):
            store[j] = out[0] if isinstance(out, tuple) else out
        handles.append(mod.register_forward_hook(hook))
    return handles
