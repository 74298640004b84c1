"""The bundle's tokenizer directory, its manifest entry (stop ids, chat format, FIM tokens) and the model's
sampling settings.

From a Hugging Face checkpoint the tokenizer files are copied and read with transformers; from a GGUF they are
rebuilt from the file's own vocabulary (``gguf.save_tokenizer``). The drafter must tokenize exactly as the target.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edge_spec.bundle import TokenizerSpec, find_fim
from edge_spec.errors import EdgeSpecError, ExportError
from edge_spec.export import build, chat_template, own_build, tokenizer_check, tool_template
from edge_spec.export import gguf as gguf_src

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

Source = build.Checkpoint | own_build.Source


def write_tokenizers(t_ckpt: Source, d_ckpt: Source | None, tok_dir: Path, cache: Path) -> TokenizerSpec:
    """Write the bundle's tokenizer dir (from the target) and check the drafter tokenizes the same way."""
    tok_dir.mkdir()
    if isinstance(t_ckpt, own_build.Source):
        gguf_src.save_tokenizer(t_ckpt.gguf, tok_dir)
    else:
        for f in TOKENIZER_FILES:
            if (t_ckpt.path / f).is_file():
                shutil.copy2(t_ckpt.path / f, tok_dir / f)
    d_dir: Path | None = None
    if d_ckpt is None:
        pass
    elif isinstance(d_ckpt, build.Checkpoint):
        d_dir = d_ckpt.path
    elif d_ckpt.kind == "gguf":
        d_dir = cache / "drafter-tokenizer"
        gguf_src.save_tokenizer(d_ckpt.gguf, d_dir)
    elif (d_ckpt.path / "tokenizer.json").is_file():  # a distilled drafter shares the target's tokenizer
        d_dir = d_ckpt.path
    if d_dir is not None and not (isinstance(t_ckpt, build.Checkpoint) and isinstance(d_ckpt, build.Checkpoint)):
        tokenizer_check.check_same_tokenizer(tok_dir, d_dir)
    if isinstance(t_ckpt, build.Checkpoint):
        return _tokenizer_spec(t_ckpt.path, tok_dir)
    spec = _tokenizer_spec(tok_dir, tok_dir)
    stops = tuple(sorted(set(spec.stop_token_ids) | set(gguf_src.end_of_turn_ids(t_ckpt.gguf))))
    bos = t_ckpt.gguf.special_ids.get("bos", spec.bos_token_id)
    fim = find_fim(_vocab(tok_dir), t_ckpt.gguf.metadata)  # the GGUF's fim_*_token_id keys win over token texts
    return TokenizerSpec(files=spec.files, vocab_size=spec.vocab_size, bos_token_id=bos, stop_token_ids=stops,
                         special_token_ids=spec.special_token_ids, chat=spec.chat, fim=fim)


def _vocab(tok_dir: Path) -> dict[str, int]:
    """Token text -> id of the bundle's tokenizer.json, added tokens included."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)


_GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                  "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p"}


def recommended_sampling(src: Source) -> dict[str, Any] | None:
    """The model's own sampling settings: a GGUF's ``general.sampling.*`` keys (llama.cpp's converter writes them
    from the model's generation config), or an HF ``generation_config.json`` with ``do_sample: true``; None when the
    source carries none (then ``edge-spec chat`` uses llama.cpp's defaults)."""
    out: dict[str, Any] = {}
    if isinstance(src, own_build.Source) and src.gguf is not None:
        for key, name in _GGUF_SAMPLING.items():
            if key in src.gguf.metadata:
                out[name] = float(src.gguf.metadata[key]) if name != "top_k" else int(src.gguf.metadata[key])
        source = "gguf"
    elif isinstance(src, build.Checkpoint) and (src.path / "generation_config.json").is_file():
        try:
            gen = json.loads((src.path / "generation_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            gen = {}
        if gen.get("do_sample"):
            for name, cast in (("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float)):
                if isinstance(gen.get(name), (int, float)) and not isinstance(gen.get(name), bool):
                    out[name] = cast(gen[name])
        source = "generation_config.json"
    if not out:
        return None
    from edge_spec.runtime.sampling import SamplingConfig

    try:
        SamplingConfig(**out)
    except EdgeSpecError:
        return None  # settings we cannot apply are not a recommendation
    return {**out, "source": source}


def _tokenizer_spec(src: Path, tok_dir: Path) -> TokenizerSpec:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except Exception as exc:
        raise ExportError(f"transformers cannot load the tokenizer in '{src}' ({exc.__class__.__name__}); "
                          "re-save it with tokenizer.save_pretrained().") from None
    tok_json = tokenizer_check.load_tokenizer_json(src)
    gen_file = src / "generation_config.json"
    gen = json.loads(gen_file.read_text(encoding="utf-8")) if gen_file.is_file() else {}
    runtime_tok = _effective_tokenizer(tok, tok_dir / "tokenizer.json")
    chat = chat_template.chat_format(tok, runtime_tok)
    if chat is not None:  # tool conversations: the runtime's Jinja rendering checked against apply_chat_template
        chat = tool_template.with_tools(tok, runtime_tok, chat)
    stops = tokenizer_check.stop_token_ids(tok, tok_json, gen, chat)
    files = tuple(f"tokenizer/{f}" for f in TOKENIZER_FILES if (tok_dir / f).is_file())
    return TokenizerSpec(files=files, vocab_size=len(tok), bos_token_id=tok.bos_token_id, stop_token_ids=stops,
                         special_token_ids=tokenizer_check.special_token_ids(tok_json), chat=chat,
                         fim=find_fim(runtime_tok.get_vocab(with_added_tokens=True)))


def _effective_tokenizer(tok, path: Path):
    """The tokenizer transformers actually runs, written as the bundle's tokenizer.json; returns it loaded.

    transformers 5 rebuilds some tokenizers from their class rather than from tokenizer.json
    (Qwen2Tokenizer sets its own pre-tokenizer and NFC normalizer), so the file alone can
    tokenize differently from ``apply_chat_template``; the runtime must match transformers."""
    from tokenizers import Tokenizer

    runtime_tok = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    runtime_tok.no_padding()
    runtime_tok.no_truncation()
    if runtime_tok.to_str() != Tokenizer.from_file(str(path)).to_str():
        runtime_tok.save(str(path))
    return Tokenizer.from_file(str(path))
