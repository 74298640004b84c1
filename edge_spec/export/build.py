"""Hugging Face checkpoint -> ONNX decoder graph, through the ORT GenAI model builder.

The builder emits GroupQueryAttention (past and present can share one buffer), fused
RMSNorm and MatMulNBits for int4/int8 weights — the fastest CPU graphs we measured
(GUIDE §3). It is called as a Python function; its chatter on stdout is captured and
only shown if it fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from edge_spec.errors import ExportError

# Decoder-only text architectures the builder dispatches on (onnxruntime-genai 0.18) that
# produce the plain input_ids/attention_mask/past/present graph our runtime drives.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
    "PhiForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GraniteForCausalLM",
    "OlmoForCausalLM", "SmolLM3ForCausalLM", "NemotronForCausalLM", "InternLM2ForCausalLM", "Ernie4_5ForCausalLM",
)
# Precisions the builder supports per execution provider (its own table, builder.get_args).
EP_PRECISIONS = {
    "cpu": ("int4", "int8", "fp32"),
    "cuda": ("int4", "int8", "fp16", "fp32"),
    "dml": ("int4", "fp16"),
    "webgpu": ("int4", "int8", "fp16", "fp32"),
}
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                 "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class BuildOptions:
    precision: str  # int4 | int8 | fp16 | fp32
    accuracy_level: int | None = None  # MatMulNBits accuracy_level (int4/int8 only)
    block_size: int = 32
    execution_provider: str = "cpu"
    max_context: int | None = None  # None: the checkpoint's max_position_embeddings
    lm_head: str | None = None  # "int8" / "fp32": keep the LM head above an int4 body (None: same as the body)


@dataclass(frozen=True)
class Checkpoint:
    name: str  # what the user passed
    path: Path  # local directory holding config.json, weights and tokenizer
    config: dict
    architecture: str


def resolve_checkpoint(name: str, role: str, trust_remote_code: bool = False) -> Checkpoint:
    """Find a local checkpoint directory (or download a hub id) and check the builder can export it."""
    path = Path(name).expanduser()
    if not path.exists():
        looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
        if not looks_like_hub_id:
            raise ExportError(f"The {role} path '{name}' does not exist; pass a GGUF file, a Hugging Face "
                              "checkpoint directory or a hub id like 'org/model'.")
        path = _download(name, role)
    if not path.is_dir():
        raise ExportError(f"The {role} '{name}' is a file but not a GGUF file; pass a .gguf file or the "
                          "checkpoint directory that holds config.json and the weights.")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ExportError(f"The {role} directory '{name}' has no config.json, so it is not a Hugging Face "
                          "checkpoint; pass the directory saved by save_pretrained().")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ExportError(f"The {role} config '{config_file}' is not valid JSON; re-save the checkpoint.") from None
    if "auto_map" in config and not trust_remote_code:
        raise ExportError(f"The {role} '{name}' needs custom code from the hub (auto_map in config.json); "
                          "re-run with --trust-remote-code if you trust its authors.")
    archs = config.get("architectures") or []
    arch = archs[0] if archs else "(none)"
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ExportError(f"The {role} architecture '{arch}' is not supported by the ONNX model builder; "
                          f"use one of: {', '.join(SUPPORTED_ARCHITECTURES)}.")
    if not any((path / f).is_file() for f in _WEIGHT_FILES):
        raise ExportError(f"The {role} directory '{name}' has no weights (model.safetensors or "
                          "pytorch_model.bin); pass a complete checkpoint.")
    if not (path / "tokenizer.json").is_file():
        raise ExportError(f"The {role} directory '{name}' has no tokenizer.json; save the fast tokenizer "
                          "with tokenizer.save_pretrained() next to the weights.")
    return Checkpoint(name=name, path=path, config=config, architecture=arch)


def _download(name: str, role: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name))
    except Exception as exc:  # network, auth, missing repo: all one sentence for the user
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else exc.__class__.__name__
        raise ExportError(f"The {role} '{name}' is not a local directory and downloading it from the Hugging "
                          f"Face hub failed ({reason}); pass a local checkpoint directory.") from None


def check_precision(precision: str, execution_provider: str, role: str) -> None:
    allowed = EP_PRECISIONS.get(execution_provider)
    if allowed is None:
        raise ExportError(f"Unknown execution provider '{execution_provider}'; use one of "
                          f"{', '.join(EP_PRECISIONS)}.")
    if precision not in allowed:
        raise ExportError(f"The model builder cannot make a {precision} {role} graph for the "
                          f"{execution_provider} execution provider; use one of {', '.join(allowed)}.")


def build_graph(ckpt: Checkpoint, out_dir: Path, opts: BuildOptions, cache_dir: Path) -> Path:
    """Run the model builder into ``out_dir``; returns the path of model.onnx."""
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    extra = [f"block_size={opts.block_size}"]
    if opts.accuracy_level is not None and opts.precision in ("int4", "int8"):
        extra.append(f"accuracy_level={opts.accuracy_level}")
    if opts.lm_head == "int8" and opts.precision == "int4":
        extra.append("matmul_mixed_precision=last_matmul:int8")
    elif opts.lm_head == "fp32" and opts.precision in ("int4", "int8"):
        extra.append("nodes_to_exclude=/lm_head/MatMul")
    if ckpt.config.get("auto_map"):
        extra.append("hf_remote=true")
    out_dir.mkdir(parents=True, exist_ok=True)
    log = io.StringIO()
    quiet = [logging.getLogger(n) for n in ("onnxruntime.quantization.matmul_nbits_quantizer", "onnxruntime",
                                            "onnx_ir", "transformers")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            kv = parse_extra_options(None, str(ckpt.path), str(out_dir), opts.precision, opts.execution_provider,
                                     str(cache_dir), extra)
            create_model(None, str(ckpt.path), str(out_dir), opts.precision, opts.execution_provider,
                         str(cache_dir), **kv)
    except OSError:
        raise
    except Exception as exc:
        last = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
        raise ExportError(f"The model builder failed on '{ckpt.name}' ({last}); re-run with --debug for the "
                          "builder log.") from exc
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    graph = out_dir / "model.onnx"
    if not graph.is_file():
        raise ExportError(f"The model builder wrote no model.onnx for '{ckpt.name}'; re-run with --debug.")
    return graph
