"""Turn a shared-embedding drafter into a plain Hugging Face checkpoint.

An edge-spec drafter stores only its own layers (the embedding / LM head are the target's). Tools that
expect a self-contained model — transformers users, llama.cpp's ``convert_hf_to_gguf.py`` — need the
embedding filled back in; this writes that checkpoint (fp16 safetensors + config + the target's tokenizer).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from edge_spec.distill.drafter import read_drafter_config
from edge_spec.distill.target import file_sha256, load_target
from edge_spec.errors import EdgeSpecError


def full_checkpoint(drafter_dir: str | Path, target: str | Path, out_dir: str | Path,
                    dtype: torch.dtype = torch.float16, check_sha256: bool = True) -> Path:
    """Write ``out_dir``: the drafter with the target's embedding (and LM head when untied) as a plain HF model.

    ``target`` must be the file the drafter was trained on (its sha256 is checked unless ``check_sha256`` is
    False). Returns ``out_dir``; written to a temporary directory first, renamed at the end."""
    drafter_dir, out_dir = Path(drafter_dir), Path(out_dir)
    cfg = read_drafter_config(drafter_dir)
    info = cfg["edge_spec_drafter"]
    if check_sha256 and file_sha256(Path(target)) != info["target_sha256"]:
        raise EdgeSpecError(f"'{target}' is not the target this drafter was trained on (sha256 differs from "
                            f"{info['target_sha256'][:16]}…); pass that exact file.")
    if out_dir.exists():
        raise EdgeSpecError(f"'{out_dir}' already exists; pass a new directory for the full checkpoint.")
    t = load_target(target)
    tensors = {k: v.to(dtype) for k, v in load_file(str(drafter_dir / "model.safetensors")).items()}
    tensors["model.embed_tokens.weight"] = t.model.model.embed_tokens.weight.detach().to(dtype).contiguous()
    if not cfg.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = t.model.lm_head.weight.detach().to(dtype).contiguous()
    plain = {k: v for k, v in cfg.items() if k != "edge_spec_drafter"}
    plain["torch_dtype"] = plain["dtype"] = str(dtype).removeprefix("torch.")
    plain["edge_spec_materialized_from"] = {"target_sha256": info["target_sha256"],
                                            "layers_from": info["layers_from"]}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(plain, indent=2, sort_keys=True) + "\n")
        t.tokenizer.save_pretrained(str(tmp))
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
