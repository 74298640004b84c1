"""The drafter: a few of the target's decoder layers on the target's own (frozen, shared) embedding and LM head.

On disk (DRAFTER_DIR) — the format ``edge-spec export`` reads:

* ``config.json``: the target's HF config with ``num_hidden_layers`` = N, plus
  ``"edge_spec_drafter": {"shares_target_embedding": true, "target_sha256": ..., "layers_from": [...], ...}``;
* ``model.safetensors``: every HF tensor of the drafter EXCEPT ``model.embed_tokens.weight`` and
  ``lm_head.weight`` (fp16, HF layout) — the bundle reuses the target's copy.

``materialize.full_checkpoint`` writes a plain HF checkpoint with the embedding filled back in.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from edge_spec.errors import EdgeSpecError

SHARED = ("model.embed_tokens.weight", "lm_head.weight")


def spread_layers(n_target: int, n: int) -> list[int]:
    """Which target layers initialise an N-layer drafter: evenly spaced, always the first and the last."""
    if not 1 <= n <= n_target:
        raise EdgeSpecError(f"--layers {n} is not possible for a target of {n_target} layers; pick 1 to {n_target}.")
    if n == 1:
        return [n_target - 1]
    return [round(i * (n_target - 1) / (n - 1)) for i in range(n)]


def build_drafter(target: torch.nn.Module, layers_from: list[int]) -> torch.nn.Module:
    """A fresh model of the target's class with ``len(layers_from)`` layers copied from the target.

    Embedding and LM head are the target's own tensors (shared, frozen); the final norm is a copy."""
    cfg = target.config.__class__.from_dict(target.config.to_dict())
    cfg.num_hidden_layers = len(layers_from)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [target.config.layer_types[i] for i in layers_from]
    drafter = target.__class__(cfg).to(next(target.parameters()).device)
    with torch.no_grad():
        for dst, src in zip(drafter.model.layers, layers_from):
            dst.load_state_dict(target.model.layers[src].state_dict())
        drafter.model.norm.load_state_dict(target.model.norm.state_dict())
    drafter.model.embed_tokens = target.model.embed_tokens
    drafter.lm_head = target.lm_head
    for p in list(drafter.model.embed_tokens.parameters()) + list(drafter.lm_head.parameters()):
        p.requires_grad_(False)
    return drafter


def trainable_state(drafter: torch.nn.Module) -> dict[str, torch.Tensor]:
    """All drafter tensors except the shared embedding / LM head (the ones stored in model.safetensors)."""
    return {k: v for k, v in drafter.state_dict().items() if k not in SHARED}


def save_drafter(drafter: torch.nn.Module, out: Path, meta: dict) -> None:
    """Write config.json (with the ``edge_spec_drafter`` block) and fp16 model.safetensors without shared tensors."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = drafter_config(drafter.config.to_dict(), drafter.__class__.__name__, len(drafter.model.layers), meta)
    tensors = {k: v.detach().to(torch.float16).contiguous().cpu() for k, v in trainable_state(drafter).items()}
    save_file(tensors, str(out / "model.safetensors.tmp"), metadata={"format": "pt"})
    (out / "model.safetensors.tmp").replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def drafter_config(target_cfg: dict, architecture: str, layers: int, meta: dict) -> dict:
    """The drafter's config.json: the target's HF config with N layers and the ``edge_spec_drafter`` block.

    A GGUF-loaded config has no ``architectures`` and carries the file's model name: both are fixed here."""
    cfg = dict(target_cfg)
    cfg["num_hidden_layers"] = layers
    cfg["architectures"] = [architecture]
    cfg["torch_dtype"] = cfg["dtype"] = "float16"
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    # The LM head is the target's too: tied to the shared embedding, or the target's own lm_head when untied.
    cfg["edge_spec_drafter"] = {"shares_target_embedding": True, "shares_target_lm_head": True, **meta}
    return cfg


def read_drafter_config(drafter_dir: Path) -> dict:
    """config.json of a drafter dir; one sentence when it is not an edge-spec drafter."""
    path = Path(drafter_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        raise EdgeSpecError(f"'{drafter_dir}' has no readable config.json; pass a directory written by "
                            "'edge-spec distill'.") from None
    if "edge_spec_drafter" not in cfg:
        raise EdgeSpecError(f"'{drafter_dir}' is not an edge-spec drafter (config.json has no 'edge_spec_drafter'); "
                            "pass a directory written by 'edge-spec distill'.")
    return cfg


def load_drafter(drafter_dir: Path, target: torch.nn.Module) -> torch.nn.Module:
    """Rebuild a saved drafter on ``target``'s shared embedding / LM head (fp32 compute)."""
    cfg = read_drafter_config(drafter_dir)
    drafter = build_drafter(target, cfg["edge_spec_drafter"]["layers_from"])
    state = {k: v.float() for k, v in load_file(str(Path(drafter_dir) / "model.safetensors")).items()}
    missing = set(trainable_state(drafter)) - set(state)
    if missing:
        raise EdgeSpecError(f"'{drafter_dir}/model.safetensors' lacks {sorted(missing)[0]}; the drafter files are "
                            "incomplete, run 'edge-spec distill' again.")
    drafter.load_state_dict(state, strict=False)
    return drafter
