"""Read a GGUF file: architecture, HF-style config, tokenizer, special tokens, and the tensors themselves.

The tensors stay in their GGUF encoding (``gguf.ReaderTensor``); :mod:`edge_spec.export.gguf_quant`
maps their blocks onto ONNX Runtime's quantized operators and :mod:`edge_spec.export.onnx_graph`
builds the decoder graph from them. Nothing here dequantizes a quantized weight.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_spec.errors import ExportError

GGUF_MAGIC = b"GGUF"
# GGUF architecture -> (HF architecture, q/k rows permuted for GGML's interleaved rope, q/k/v bias, q/k norm)
ARCHITECTURES: dict[str, tuple[str, bool, bool, bool]] = {
    "llama": ("LlamaForCausalLM", True, False, False),
    "mistral": ("MistralForCausalLM", False, False, False),
    "qwen2": ("Qwen2ForCausalLM", False, True, False),
    "qwen3": ("Qwen3ForCausalLM", False, False, True),
    "phi3": ("Phi3ForCausalLM", False, False, False),
    "gemma2": ("Gemma2ForCausalLM", False, False, False),
    "gemma3": ("Gemma3ForCausalLM", False, False, True),
}
GEMMA = ("gemma2", "gemma3")


@dataclass(frozen=True)
class GGUFModel:
    """One GGUF file, opened. ``tensors`` maps GGUF names (``blk.0.attn_q.weight``) to reader tensors."""

    name: str  # what the user passed
    path: Path
    gguf_arch: str  # GGUF ``general.architecture``, e.g. "llama"
    architecture: str  # HF architecture, e.g. "LlamaForCausalLM"
    config: dict[str, Any]  # HF-style config (num_hidden_layers, hidden_size, rope_theta, ...)
    tensors: dict[str, Any] = field(repr=False)
    metadata: dict[str, Any] = field(repr=False)  # scalar / string metadata fields (no token arrays)
    permuted_qk: bool = False  # GGUF llama q/k rows are in GGML's interleaved-rope order
    qkv_bias: bool = False
    qk_norm: bool = False

    @property
    def special_ids(self) -> dict[str, int]:
        """bos / eos / eot / eom / unk / pad token ids named in the GGUF metadata."""
        out = {}
        for key in ("bos", "eos", "eot", "eom", "unknown", "padding"):
            v = self.metadata.get(f"tokenizer.ggml.{key}_token_id")
            if v is not None:
                out[key] = int(v)
        return out


def release(t: Any) -> None:
    """Drop the pages of reader tensor ``t``'s bytes from this process's resident set once it is converted.

    The reader maps the file; every page read stays resident (and counted in RSS) while the file is open, which is
    the whole export. Dropped pages stay in the page cache and are read again if touched (MADV_DONTNEED on a
    read-only mapping loses nothing). A no-op where the mapping cannot be advised."""
    base = np.asarray(t.data)
    while base is not None and not hasattr(base, "_mmap"):
        base = getattr(base, "base", None)
    mm = getattr(base, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    lead = base.offset % mmap.ALLOCATIONGRANULARITY  # the mapping starts this far before the array's first byte
    start = np.asarray(t.data).ctypes.data - base.ctypes.data + lead
    page = start - start % mmap.PAGESIZE
    length = start + int(t.n_bytes) - page
    if page >= 0 and page + length <= len(mm):
        mm.madvise(mmap.MADV_DONTNEED, page, length)


def is_gguf(path: str | Path) -> bool:
    """True when ``path`` is a file starting with the GGUF magic bytes."""
    p = Path(path).expanduser()
    try:
        with open(p, "rb") as f:
            return p.is_file() and f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _field_value(f: Any) -> Any:
    try:
        return f.contents()
    except Exception:  # an odd type the reader cannot decode: not something we need
        return None


def read_gguf(name: str, role: str) -> GGUFModel:
    """Open ``name`` (a .gguf file) and describe it; one-sentence :class:`ExportError` when it cannot be used."""
    import gguf

    path = Path(name).expanduser()
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as exc:
        raise ExportError(f"The {role} '{name}' is not a readable GGUF file ({str(exc).splitlines()[0][:120]}); "
                          "check the file is complete (compare its sha256) or re-download it.") from None
    meta = {k: _field_value(f) for k, f in reader.fields.items()
            if not k.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                                 "tokenizer.ggml.scores"))}
    arch = str(meta.get("general.architecture") or "(none)")
    if arch not in ARCHITECTURES:
        raise ExportError(f"The {role} GGUF architecture '{arch}' is not supported by edge-spec's GGUF exporter; "
                          f"use one of: {', '.join(ARCHITECTURES)}.")
    hf_arch, permuted, bias, qk_norm = ARCHITECTURES[arch]
    tensors = {t.name: t for t in reader.tensors}
    config = _config(arch, meta, tensors, role, name)
    config["architectures"] = [hf_arch]
    return GGUFModel(name=name, path=path, gguf_arch=arch, architecture=hf_arch, config=config, tensors=tensors,
                     metadata=meta, permuted_qk=permuted, qkv_bias=bias, qk_norm=qk_norm)


def _config(arch: str, meta: dict[str, Any], tensors: dict[str, Any], role: str, name: str) -> dict[str, Any]:
    """GGUF hyperparameters -> HF config keys, through transformers' own GGUF mapping."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    cfg: dict[str, Any] = {"model_type": arch}
    for key, hf_key in GGUF_CONFIG_MAPPING.get(arch, {}).items():
        v = meta.get(f"{arch}.{key}")
        if hf_key is not None and v is not None:
            cfg[hf_key] = v
    for need in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"):
        if need not in cfg:
            raise ExportError(f"The {role} GGUF '{name}' has no '{arch}' hyperparameter for {need}; the file is "
                              "incomplete or was written by a converter edge-spec does not know.")
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg.setdefault("rms_norm_eps", 1e-6)
    cfg.setdefault("rope_theta", 10000.0)
    key_len = meta.get(f"{arch}.attention.key_length")
    cfg["head_dim"] = int(key_len or cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    if "vocab_size" not in cfg:
        cfg["vocab_size"] = int(tensors["token_embd.weight"].shape[-1])
    cfg.setdefault("max_position_embeddings", 4096)
    cfg["tie_word_embeddings"] = "output.weight" not in tensors
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise ExportError(f"The {role} GGUF uses '{scaling}' rope scaling, which edge-spec's GGUF exporter does "
                          "not support yet; use a model with plain or linear rope scaling.")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(meta.get(f"{arch}.rope.scaling.factor", 1.0))}
    if arch == "phi3":
        _phi3_checks(meta, tensors, cfg, role, name)
    if arch in GEMMA:
        _gemma_config(arch, meta, cfg)
    for key in ("bos", "eos"):
        v = meta.get(f"tokenizer.ggml.{key}_token_id")
        if v is not None:
            cfg[f"{key}_token_id"] = int(v)
    for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "max_position_embeddings", "vocab_size"):
        cfg[k] = int(cfg[k])
    cfg["rope_theta"], cfg["rms_norm_eps"] = float(cfg["rope_theta"]), float(cfg["rms_norm_eps"])
    return cfg


def _phi3_checks(meta: dict[str, Any], tensors: dict[str, Any], cfg: dict[str, Any], role: str, name: str) -> None:
    """Refuse the Phi-3 variants transformers' GGUF loader reads wrongly (so nothing could check our graph)."""
    if any(t.startswith("rope_factors_") for t in tensors):
        raise ExportError(f"The {role} GGUF '{name}' is a long-context Phi-3 (LongRoPE rope_factors_long/short), "
                          "which transformers' GGUF loader does not support; use a 4k-context Phi-3 GGUF.")
    rot = meta.get("phi3.rope.dimension_count")
    if rot is not None and int(rot) != cfg["head_dim"]:
        raise ExportError(f"The {role} GGUF '{name}' rotates {int(rot)} of {cfg['head_dim']} head dimensions "
                          "(partial rotary, e.g. Phi-4-mini), which edge-spec's GGUF exporter does not support.")


def _gemma_config(arch: str, meta: dict[str, Any], cfg: dict[str, Any]) -> None:
    """Gemma 2/3 hyperparameters as llama.cpp reads them (src/models/gemma2.cpp, gemma3.cpp), in HF config keys.

    transformers' GGUF loader reads only ``sliding_window`` of these and takes its config defaults for the
    rest; llama.cpp's values are the file's own (its converter wrote them), so they win here."""
    n = cfg["num_hidden_layers"]
    # the attention scale: 1/sqrt(head_dim), except the 27B models (46 / 62 layers): 1/sqrt(hidden / heads)
    big = n == (46 if arch == "gemma2" else 62)
    cfg["query_pre_attn_scalar"] = float(cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"])
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    soft = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0} if arch == "gemma2" else {}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        v = meta.get(f"{arch}.{key}", soft.get(key))
        cfg[key] = float(v) if v else None
    window = meta.get(f"{arch}.attention.sliding_window", 4096 if arch == "gemma2" else None)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if not window:  # a Gemma 3 without a window: every layer global
        local = [False] * n
    elif isinstance(pattern, list):  # per-layer flags
        local = [bool(x) for x in pattern][:n]
    else:  # llama.cpp's set_swa_pattern: every n-th layer global, the others local
        p = int(pattern)
        local = [p == 0 or i % p < p - 1 for i in range(n)]
    cfg["sliding_window"] = int(window) if window else None
    cfg["layer_types"] = ["sliding_attention" if x else "full_attention" for x in local]
    base = meta.get(f"{arch}.rope.freq_base_swa")
    cfg["rope_local_base_freq"] = float(base) if base else (10000.0 if arch == "gemma3" else None)


def save_tokenizer(model: GGUFModel, out_dir: Path) -> None:
    """Write the GGUF's tokenizer as tokenizer.json + tokenizer_config.json (+ chat template) into ``out_dir``."""
    from transformers import AutoTokenizer

    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        tok = AutoTokenizer.from_pretrained(str(model.path.parent), gguf_file=model.path.name)
    except Exception as exc:
        raise ExportError(f"transformers cannot read the tokenizer in the GGUF '{model.name}' "
                          f"({str(exc).splitlines()[0][:120] if str(exc) else exc.__class__.__name__}); the file's "
                          "tokenizer metadata is missing or of an unsupported kind.") from None
    finally:
        quiet.setLevel(level)
    template = model.metadata.get("tokenizer.chat_template")
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = str(template)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    if not (out_dir / "tokenizer.json").is_file():
        raise ExportError(f"The tokenizer of the GGUF '{model.name}' has no fast (tokenizer.json) form; edge-spec "
                          "needs a fast tokenizer.")


def end_of_turn_ids(model: GGUFModel) -> tuple[int, ...]:
    """EOS / end-of-turn / end-of-message ids from the GGUF metadata (generation stops on them)."""
    ids = model.special_ids
    return tuple(sorted({ids[k] for k in ("eos", "eot", "eom") if k in ids}))
