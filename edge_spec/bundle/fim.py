"""Finding a model's fill-in-the-middle tokens, the way llama.cpp does (``llama-vocab.cpp``).

A GGUF may name them in its metadata (``tokenizer.ggml.fim_pre_token_id`` and the five others); many
GGUFs (Qwen2.5-Coder's among them) and every Hugging Face tokenizer name none, and llama.cpp then finds
each by the text of a token in the vocabulary. :func:`find_fim` does both: the export records the result
in the manifest (``tokenizer.fim``), and the runtime derives it from the bundle's tokenizer for bundles
written before the field existed. Only the standard library is imported (the lean runtime uses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_spec.bundle.manifest import FimTokens

# FimTokens field -> the GGUF metadata key llama.cpp's converter writes
FIM_GGUF_KEYS: dict[str, str] = {
    "prefix": "tokenizer.ggml.fim_pre_token_id",
    "suffix": "tokenizer.ggml.fim_suf_token_id",
    "middle": "tokenizer.ggml.fim_mid_token_id",
    "pad": "tokenizer.ggml.fim_pad_token_id",
    "repo_name": "tokenizer.ggml.fim_rep_token_id",
    "file_sep": "tokenizer.ggml.fim_sep_token_id",
}

# FimTokens field -> the token texts llama.cpp recognises when the metadata names no id, in its order
FIM_TEXTS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
               "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
               "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
               "<|code_middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "repo_name": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "file_sep": ("<|file_sep|>",),
}


def find_fim(vocab: Mapping[str, int], metadata: Mapping[str, Any] | None = None) -> FimTokens | None:
    """The FIM tokens of a model whose vocabulary (token text -> id, added tokens included) is ``vocab``.

    ``metadata``: a GGUF's key-value metadata; an id it names wins over the text search. None when the
    model lacks any of prefix, suffix and middle (it cannot fill in the middle)."""
    ids: dict[str, int] = {}
    from_gguf = False
    for name, key in FIM_GGUF_KEYS.items():
        value = (metadata or {}).get(key)
        if value is not None and not isinstance(value, bool) and 0 <= int(value):
            ids[name] = int(value)
            from_gguf = True
            continue
        for text in FIM_TEXTS[name]:
            if text in vocab:
                ids[name] = int(vocab[text])
                break
    if not all(k in ids for k in ("prefix", "suffix", "middle")):
        return None
    return FimTokens(**ids, source="gguf" if from_gguf else "tokenizer")
