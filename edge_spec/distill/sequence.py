"""One training sequence (target-written ids with the teacher's targets at its answer positions) and the shard
files that hold them.

Shard arrays (n sequences, R generated positions in total, k = top-k):
``tokens`` int32 [sum of lengths] prompt+answer ids, ``seq_off`` int64 [n+1], ``prompt_len`` int32 [n],
``temp`` float32 [n], ``heldout`` bool [n], ``topk_ids`` int32 [R, k], ``topk_logits`` float16 [R, k],
``lse`` float32 [R, 2] (logsumexp of the logits at T = 1 and at T = :data:`EVAL_TEMPERATURE`).
Writing them is ``data.py``'s (:func:`write_shard`), reading them every stage's (:func:`load_sequences`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EVAL_TEMPERATURE = 0.7  # the second logsumexp column; the T=0.7 acceptance is measured with it


@dataclass
class Sequence:
    """One training/eval sequence: ids [L], where the answer starts, teacher targets for answer positions."""

    ids: np.ndarray  # int32 [L]
    prompt_len: int
    temp: float
    topk_ids: np.ndarray  # int32 [L - prompt_len, k]; row t = p(. | ids[:prompt_len + t])
    topk_logits: np.ndarray  # float16 [L - prompt_len, k]
    lse: np.ndarray  # float32 [L - prompt_len, 2]


def load_sequences(shards: list[Path]) -> tuple[list[Sequence], list[Sequence]]:
    """(train, heldout) sequences from the shards, in shard order."""
    train, held = [], []
    for path in shards:
        z = np.load(path)
        off, r = z["seq_off"], 0
        for i in range(len(z["prompt_len"])):
            ids = z["tokens"][off[i]:off[i + 1]]
            pl = int(z["prompt_len"][i])
            n = len(ids) - pl
            seq = Sequence(ids, pl, round(float(z["temp"][i]), 4), z["topk_ids"][r:r + n], z["topk_logits"][r:r + n],
                           z["lse"][r:r + n])
            r += n
            if n > 0:
                (held if z["heldout"][i] else train).append(seq)
    return train, held


def write_shard(path: Path, prompt_ids: list[list[int]], results: list[dict[str, np.ndarray]], temp: float,
                heldout: list[bool], convs: list[dict], seconds: float, precision: str) -> None:
    """Write one shard atomically: ``path`` (.npz, the arrays above) and its ``.json`` sidecar (the conversations
    as text, generation seconds, temperature, precision). ``results`` per sequence: ``answer`` [L] and the teacher's
    ``topk_ids`` / ``topk_logits`` [L, k] and ``lse`` [L, 2] (``data.generate``)."""
    seqs = [np.concatenate([np.asarray(p, np.int32), r["answer"]]) for p, r in zip(prompt_ids, results)]
    arrays = {
        "tokens": np.concatenate(seqs).astype(np.int32),
        "seq_off": np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
        "prompt_len": np.asarray([len(p) for p in prompt_ids], np.int32),
        "temp": np.full(len(seqs), temp, np.float32),
        "heldout": np.asarray(heldout, bool),
        "topk_ids": np.concatenate([r["topk_ids"] for r in results]),
        "topk_logits": np.concatenate([r["topk_logits"] for r in results]),
        "lse": np.concatenate([r["lse"] for r in results]),
    }
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    side = {"conversations": convs, "seconds": round(seconds, 2), "temperature": temp, "precision": precision}
    path.with_suffix(".json").write_text(json.dumps(side) + "\n")
    os.replace(tmp, path)  # the .npz appears last: its presence means the shard is complete
