"""Target-written answers as token ids only: the durable, compact form of distillation data.

The generation shards hold the teacher's top-k logits at every answer position (~200 bytes per token);
``answers.npz`` keeps only what cannot be recomputed cheaply — the token ids the target wrote (uint16 when
the vocabulary allows: 2 bytes per token, ~2 MB per million tokens compressed), where each answer starts,
its temperature and held-out flag — so data can be kept across runs, copied, and committed for the demo.
A run given such a file (``edge-spec distill --data answers.npz``) recomputes the teacher's top-k and
logsumexp with one teacher-forced pass (:func:`teacher_targets`) instead of generating again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from edge_spec.distill import parallel
from edge_spec.distill.sequence import EVAL_TEMPERATURE, Sequence
from edge_spec.errors import EdgeSpecError

FORMAT = "edge-spec-answers/1"


def pack(train: list[Sequence], held: list[Sequence], out: Path, meta: dict) -> Path:
    """Write ``out`` (answers.npz, atomically): ids of every sequence, prompt lengths, temperatures, held-out flags."""
    seqs = train + held
    top = max((int(s.ids.max()) for s in seqs if len(s.ids)), default=0)
    dtype = np.uint16 if top < 65536 else np.int32
    arrays = {
        "tokens": np.concatenate([np.asarray(s.ids) for s in seqs]).astype(dtype),
        "seq_off": np.concatenate([[0], np.cumsum([len(s.ids) for s in seqs])]).astype(np.int64),
        "prompt_len": np.asarray([s.prompt_len for s in seqs], np.int32),
        "temp": np.asarray([s.temp for s in seqs], np.float32),
        "heldout": np.asarray([False] * len(train) + [True] * len(held)),
        "meta": np.frombuffer(json.dumps({"format": FORMAT, **meta}).encode(), np.uint8),
    }
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, out)
    return out


def read(path: Path) -> tuple[list[Sequence], list[Sequence], dict]:
    """(train, held-out, meta) sequences of an answers file, teacher targets empty (see :func:`teacher_targets`)."""
    try:
        z = np.load(path)
        meta = json.loads(bytes(z["meta"]).decode())
        tokens, off, pl, temp, held = (z[k] for k in ("tokens", "seq_off", "prompt_len", "temp", "heldout"))
    except (OSError, ValueError, KeyError) as exc:
        raise EdgeSpecError(f"'{path}' is not an answers file written by edge-spec distill ({exc}); pass the "
                            "data/answers.npz of a distill run.") from None
    if meta.get("format") != FORMAT:
        raise EdgeSpecError(f"'{path}' is not an answers file written by edge-spec distill; pass the "
                            "data/answers.npz of a distill run.")
    train, heldout = [], []
    empty = np.zeros((0, 0), np.int32)
    for i in range(len(pl)):
        ids = tokens[off[i]:off[i + 1]].astype(np.int32)
        seq = Sequence(ids, int(pl[i]), round(float(temp[i]), 4), empty, empty.astype(np.float16),
                       np.zeros((0, 2), np.float32))
        (heldout if held[i] else train).append(seq)
    return train, heldout, meta


def read_many(paths: list[Path]) -> tuple[list[Sequence], list[Sequence], dict]:
    """:func:`read` of several answers files of one target (runs with other seeds, other sessions), concatenated in
    order without repeats: a sequence equal to an earlier one (the same prompt answered greedily twice) is kept once.
    Returns (train, held-out, meta); meta's ``files`` lists each file with its counts."""
    train: list[Sequence] = []
    held: list[Sequence] = []
    seen: set[tuple[int, bytes]] = set()
    meta: dict = {"files": []}
    for path in paths:
        t, h, m = read(Path(path))
        sha = m.get("target_sha256")
        if sha is not None and meta.get("target_sha256", sha) != sha:
            raise EdgeSpecError(f"'{path}' holds answers of another target than '{paths[0]}' (sha256 {sha[:12]}...); "
                                "pass answers files of one target.")
        if sha is not None:
            meta["target_sha256"] = sha
        kept = train_tokens = 0
        for seqs, out in ((t, train), (h, held)):
            for seq in seqs:
                key = (seq.prompt_len, seq.ids.astype(np.int32).tobytes())
                if key not in seen:
                    seen.add(key)
                    out.append(seq)
                    kept += 1
                    train_tokens += (len(seq.ids) - seq.prompt_len) if out is train else 0
        meta["generation_seconds"] = (meta.get("generation_seconds") or 0.0) + (m.get("generation_seconds") or 0.0)
        meta["files"].append({"file": str(path), "sequences": len(t) + len(h), "kept": kept,
                              "train_tokens": train_tokens,
                              # text the target did not write (e.g. teacher-forced ShareGPT replies) says so
                              # in "source"; the target's own answers may say how they were made in "origin"
                              **({"source": m["source"]} if m.get("source") else {})})
    return train, held, meta


def split_heldout(train: list[Sequence], percent: int) -> tuple[list[Sequence], list[Sequence]]:
    """Hold out ``percent`` % of ``train`` by a hash of each sequence's prompt ids, for answers files that mark none
    held out (e.g. written by a script rather than a distill run): stable (the same prompt always lands on the same
    side, whatever the files and their order), and a prompt answered twice stays on one side. Returns (train, held)."""
    kept: list[Sequence] = []
    held: list[Sequence] = []
    for seq in train:
        digest = hashlib.sha256(np.asarray(seq.ids[:seq.prompt_len], np.int32).tobytes()).digest()
        (held if int.from_bytes(digest[:4], "little") % 100 < percent else kept).append(seq)
    return kept, held


@torch.no_grad()
def fill_teacher(model: torch.nn.Module, seq: Sequence, hidden: torch.Tensor, top_k: int) -> None:
    """Set ``seq``'s teacher top-k ids / logits and logsumexp (T = 1 and 0.7) from ``hidden`` [S', H], the target's
    final (normed) hidden states of its first S' ids: one row per answer token whose position S' covers."""
    a, b = seq.prompt_len - 1, min(len(seq.ids), len(hidden)) - 1  # positions whose next token is an answer token
    logits = model.lm_head(hidden[a:max(a, b)]).float()  # [answer rows, V]
    top_v, top_i = logits.topk(top_k, -1)
    seq.topk_ids = top_i.cpu().numpy().astype(np.int32)
    seq.topk_logits = top_v.cpu().numpy().astype(np.float16)
    seq.lse = torch.stack([logits.logsumexp(-1), (logits / EVAL_TEMPERATURE).logsumexp(-1)], -1).cpu() \
        .numpy().astype(np.float32)


def teacher_targets(model: torch.nn.Module, seqs: list[Sequence], top_k: int = 32, batch_tokens: int = 4096,
                    log: Callable[[str], None] = print) -> None:
    """Fill each sequence's teacher top-k ids / logits and logsumexp (T = 1 and 0.7) at its answer positions, from
    one teacher-forced pass: row t = the target's distribution over ids[prompt_len + t] (as generation stored).

    Under ``torchrun`` every rank calls it with the same ``seqs``: each passes every world-th sequence and the ranks
    exchange what they computed (~200 bytes per answer position)."""
    if parallel.world() == 1:
        _teacher_pass(model, seqs, top_k, batch_tokens, log)
        return
    idx = parallel.mine(len(seqs))
    _teacher_pass(model, [seqs[i] for i in idx], top_k, batch_tokens, log)
    for part, rows in parallel.gather((idx, [(seqs[i].topk_ids, seqs[i].topk_logits, seqs[i].lse) for i in idx])):
        for i, (ids, logits, lse) in zip(part, rows, strict=True):
            seqs[i].topk_ids, seqs[i].topk_logits, seqs[i].lse = ids, logits, lse


@torch.no_grad()
def _teacher_pass(model: torch.nn.Module, seqs: list[Sequence], top_k: int, batch_tokens: int,
                  log: Callable[[str], None]) -> None:
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].ids))
    dev = next(model.parameters()).device
    t0, done, total, shown = time.time(), 0, sum(len(s.ids) for s in seqs), time.time()
    i = 0
    while i < len(order):
        width = len(seqs[order[i]].ids)
        idx = order[i:i + max(1, batch_tokens // max(width, 1))]
        ids = torch.zeros(len(idx), width, dtype=torch.int64)
        mask = torch.zeros(len(idx), width, dtype=torch.int64)
        for r, s in enumerate(idx):
            n = len(seqs[s].ids)
            ids[r, :n] = torch.from_numpy(seqs[s].ids.astype(np.int64))
            mask[r, :n] = 1
        hidden = model.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False).last_hidden_state
        for r, s in enumerate(idx):
            fill_teacher(model, seqs[s], hidden[r], top_k)
        i += len(idx)
        done += int(mask.sum())
        if time.time() - shown > 30 or i >= len(order):  # a line every 30 s
            shown = time.time()
            log(f"teacher: {done:,}/{total:,} positions, {done / max(time.time() - t0, 1e-9):,.0f} pos/s")
