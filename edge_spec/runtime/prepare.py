"""What ``Engine.load`` reads before it creates sessions: manifest, tokenizer, the memory plan, the id map."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_spec.bundle import Manifest, read_manifest
from edge_spec.errors import BundleError, EdgeSpecError
from edge_spec.runtime import chat as chat_mod
from edge_spec.runtime.budget import Plan, plan_memory, request_context
from edge_spec.runtime.config import LoadConfig
from edge_spec.runtime.memory import settled_rss

# the process baseline is rounded up to whole 4 MiB, so that processes whose heaps differ by a few hundred KiB plan
# alike (tests/test_plan_agreement.py)
BASELINE_ROUNDING = 4 << 20
Prompt = str | Sequence[int] | Sequence[dict[str, Any]]  # text, token ids, or chat messages


def prepare(root: Path, config: LoadConfig, prompt: Prompt | None = None,
            max_new_tokens: int | None = None) -> tuple[Manifest, Tokenizer, Plan]:
    """Manifest, tokenizer and memory plan: everything ``load`` does before creating sessions."""
    manifest = read_manifest(root)
    try:
        tokenizer = Tokenizer.from_file(str(root / manifest.tokenizer.files[0]))
    except Exception as exc:
        raise BundleError(f"The tokenizer in '{root}' cannot be read ({exc}); re-export the bundle.") from None
    tokenizer.encode("warm up")  # the tokenizer's first call allocates; count it in the baseline
    max_context, sized = config.max_context, None
    if max_context is None and max_new_tokens is not None:  # size the KV for this request, not the bundle
        n_prompt = prompt_tokens(manifest, tokenizer, prompt)
        max_context = request_context(n_prompt, max_new_tokens)
        sized = f"context sized for the request ({n_prompt} prompt + {max_new_tokens} new tokens)"
    # Rounded up to whole 4 MiB: two processes that loaded the same modules (inspect, generate, an
    # app) differ by a few hundred KiB of heap, and must still make the same plan for one budget. Settled: the heap
    # the tokenizer's load freed is given back first, so the baseline is what stays resident.
    baseline = -(-settled_rss() // BASELINE_ROUNDING) * BASELINE_ROUNDING
    plan = plan_memory(manifest, config.memory_budget, baseline, max_context=max_context,
                       draft_length=config.draft_length, drafting=config.drafting)
    if sized is not None:
        plan = dataclasses.replace(plan, notes=(sized, *plan.notes))
    return manifest, tokenizer, plan


def prompt_tokens(manifest: Manifest, tokenizer: Tokenizer, prompt: Prompt | None) -> int:
    """Tokens ``prompt`` takes: text is encoded, token ids counted, chat messages rendered with the bundle's format."""
    if prompt is None:
        return 0
    if isinstance(prompt, str):
        return len(tokenizer.encode(prompt).ids)
    items = list(prompt)
    if items and all(isinstance(m, dict) for m in items):
        if manifest.tokenizer.chat is None:
            raise EdgeSpecError("This bundle has no chat format, so chat messages cannot size the context; pass "
                                "the prompt as text or token ids.")
        return len(chat_mod.encode_chat(tokenizer, manifest.tokenizer.chat, items, True))
    return len(items)


def load_id_map(root: Path, m: Manifest) -> np.ndarray:
    path = root / m.vocab_trim.id_map
    try:
        id_map = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise BundleError(f"The drafter id map '{path}' cannot be read ({exc}); re-export the bundle.") from None
    if id_map.ndim != 1 or id_map.dtype.kind not in "iu" or len(id_map) != m.drafter.vocab_size:
        raise BundleError(f"The drafter id map '{path}' should be an int array of {m.drafter.vocab_size} target "
                          f"ids but is {id_map.dtype}{list(id_map.shape)}; re-export the bundle.")
    if id_map.min() < 0 or id_map.max() >= m.target.vocab_size:
        raise BundleError(f"The drafter id map '{path}' has ids outside the target vocabulary; re-export the bundle.")
    if len(np.unique(id_map)) != len(id_map):  # a target id with two drafter rows: q over target ids is ill-defined
        raise BundleError(f"The drafter id map '{path}' lists a target id twice; re-export the bundle.")
    return id_map.astype(np.int64)
