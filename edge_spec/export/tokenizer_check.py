"""Tokenizer compatibility (target vs drafter) and the bundle's tokenizer description.

Speculative decoding compares token ids across the two models, so they must tokenize
identically. We compare the parts of ``tokenizer.json`` that decide ids and text, in a
fixed order, and name the first difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_spec.bundle import ChatFormat
from edge_spec.errors import ExportError

END_OF_TURN_NAMES = ("<|end|>", "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eot|>")


def load_tokenizer_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportError(f"Cannot read {path / 'tokenizer.json'} ({exc.__class__.__name__}); re-save the "
                          "tokenizer with save_pretrained().") from None


def _tok_config(path: Path) -> dict[str, Any]:
    f = path / "tokenizer_config.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def _token_str(v: Any) -> Any:
    return v.get("content") if isinstance(v, dict) else v


def first_difference(a: dict[str, Any], b: dict[str, Any], a_cfg: dict[str, Any] | None = None,
                     b_cfg: dict[str, Any] | None = None) -> str | None:
    """Describe the first way tokenizer ``b`` differs from ``a``, or None if they agree."""
    ma, mb = a.get("model") or {}, b.get("model") or {}
    if ma.get("type") != mb.get("type"):
        return f"the tokenizer model type ({ma.get('type')} vs {mb.get('type')})"
    va, vb = ma.get("vocab"), mb.get("vocab")
    if isinstance(va, list):  # Unigram: [[piece, score], ...]
        va = {p[0]: i for i, p in enumerate(va)}
        vb = {p[0]: i for i, p in enumerate(vb or [])}
    va, vb = va or {}, vb or {}
    if va != vb:
        ia = {i: t for t, i in va.items()}
        ib = {i: t for t, i in vb.items()}
        for i in range(max(len(ia), len(ib))):
            if ia.get(i) != ib.get(i):
                return f"the vocabulary at id {i} ({ia.get(i)!r} vs {ib.get(i)!r})"
        return f"the vocabulary size ({len(va)} vs {len(vb)})"
    mga, mgb = ma.get("merges") or [], mb.get("merges") or []
    if mga != mgb:
        for i in range(max(len(mga), len(mgb))):
            x, y = (mga[i] if i < len(mga) else None), (mgb[i] if i < len(mgb) else None)
            if x != y:
                return f"merge rule {i} ({x!r} vs {y!r})"
    for key, label in (("normalizer", "the normalizer"), ("pre_tokenizer", "the pre-tokenizer")):
        if a.get(key) != b.get(key):
            return label
    sa = {t["id"]: (t["content"], t.get("special", False)) for t in a.get("added_tokens") or []}
    sb = {t["id"]: (t["content"], t.get("special", False)) for t in b.get("added_tokens") or []}
    for i in sorted(set(sa) | set(sb)):
        if sa.get(i) != sb.get(i):
            return f"the added/special token at id {i} ({sa.get(i, (None,))[0]!r} vs {sb.get(i, (None,))[0]!r})"
    for key, label in (("post_processor", "the post-processor"), ("decoder", "the decoder")):
        if a.get(key) != b.get(key):
            return label
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        x, y = _token_str((a_cfg or {}).get(key)), _token_str((b_cfg or {}).get(key))
        if x != y:
            return f"the {key} in tokenizer_config.json ({x!r} vs {y!r})"
    return None


def check_same_tokenizer(target: Path, drafter: Path) -> None:
    """Raise :class:`ExportError` naming the first difference between the two tokenizers."""
    diff = first_difference(load_tokenizer_json(target), load_tokenizer_json(drafter),
                            _tok_config(target), _tok_config(drafter))
    if diff is not None:
        raise ExportError(f"The target and drafter tokenizers differ in {diff}; speculative decoding needs a "
                          "drafter from the same tokenizer family.")


def stop_token_ids(tok: Any, tok_json: dict[str, Any], gen_config: dict[str, Any], chat: ChatFormat | None
                   ) -> tuple[int, ...]:
    """EOS ids from generation_config and the tokenizer, plus end-of-turn tokens."""
    ids: list[int] = []
    eos = gen_config.get("eos_token_id")
    ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    specials = {t["content"]: t["id"] for t in tok_json.get("added_tokens") or [] if t.get("special")}
    for name in END_OF_TURN_NAMES:
        if name in specials:
            ids.append(specials[name])
    if chat is not None and "assistant" in chat.roles:
        suffix = chat.roles["assistant"][1]
        for name, i in specials.items():  # the special token that closes an assistant turn ends generation
            if name and suffix.lstrip().startswith(name):
                ids.append(i)
    return tuple(sorted(set(int(i) for i in ids)))


def special_token_ids(tok_json: dict[str, Any]) -> tuple[int, ...]:
    return tuple(sorted(int(t["id"]) for t in tok_json.get("added_tokens") or [] if t.get("special")))
