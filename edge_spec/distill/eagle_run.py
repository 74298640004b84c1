"""``edge-spec distill --kind eagle3``: features, vocabulary, head initialisation, training, the saved head."""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from edge_spec.distill import parallel
from edge_spec.distill.card import render_eagle_card
from edge_spec.distill.config import DistillConfig, check_marker
from edge_spec.distill.eagle import Eagle3Head, load_head, save_head
from edge_spec.distill.eagle_init import (
    DEFAULT_DRAFT_VOCAB,
    choose_vocab,
    fold_scale,
    grow_vocab,
    head_config,
    init_head,
    resize_mlp,
)
from edge_spec.distill.eagle_train import format_acceptance, train_head
from edge_spec.distill.features import aux_scale, extract_features
from edge_spec.distill.sequence import Sequence
from edge_spec.errors import EdgeSpecError

if TYPE_CHECKING:
    from edge_spec.distill.target import Target


def our_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """The residual streams our heads read: low (entering layer 2), middle, and the last layer's output.

    EAGLE-3's published default stops at L - 3; on SmolLM2 a probe fed 2 / 15 / the last output and beat the last
    output alone (GUIDE, "Feature drafter probe")."""
    return (min(2, n_layers), n_layers // 2, n_layers)


def run_aux_layers(cfg: DistillConfig, n_layers: int) -> tuple[int, ...]:
    """The residual streams this run's head reads (``--aux-layers`` or :func:`our_aux_layers`); one sentence when
    one names a layer the target lacks."""
    aux = tuple(cfg.aux_layers) if cfg.aux_layers else our_aux_layers(n_layers)
    if any(not 0 <= j <= n_layers for j in aux):
        raise EdgeSpecError(f"--aux-layers {list(aux)} names a layer the target lacks; use 0 (the embeddings) to "
                            f"{n_layers} (the last layer's output).")
    return aux


def train_eagle(cfg: DistillConfig, target: Target, train_seqs: list[Sequence], held_seqs: list[Sequence],
                data_stats: dict, seconds: float | None, log: Callable[[str], None] = print,
                teacher_top_k: int | None = None, prior: Eagle3Head | None = None) -> dict:
    """Train (or resume) an EAGLE-3 head in ``cfg.out`` and save it in the published layout; return the report.

    ``teacher_top_k``: the sequences carry ids only; the feature pass fills their teacher targets.
    ``prior``: the head of ``cfg.init_from`` (:func:`prior_head`), to start from (its draft vocabulary and weights)
    instead of the target's layers."""
    t_start = time.time()
    model = target.model
    n = model.config.num_hidden_layers
    aux = run_aux_layers(cfg, n)
    ecfg = dataclasses.replace(cfg.eagle, seed=cfg.seed)
    if prior is not None:  # a continuation trains at its own (lower) peak rate after a longer warm-up
        ecfg = dataclasses.replace(ecfg, lr=ecfg.continue_lr, warmup=ecfg.continue_warmup)
    ckpt = cfg.out / "checkpoint-eagle3"
    width = ecfg.mlp or (prior.c.intermediate if prior is not None else model.config.intermediate_size)
    vocab_size = ecfg.draft_vocab or (prior.c.draft_vocab if prior is not None else DEFAULT_DRAFT_VOCAB)
    if prior is not None and vocab_size < prior.c.draft_vocab:
        raise EdgeSpecError(f"--draft-vocab {vocab_size:,} is smaller than the --init-from head's "
                            f"{prior.c.draft_vocab:,} tokens; a continued head can only grow its vocabulary: pass a "
                            "larger size or leave --draft-vocab out.")
    check_marker(ckpt / "train.json", {"aux_layers": list(aux), "draft_vocab": vocab_size,
                                       "max_len": ecfg.max_len, "depth": ecfg.depth,
                                       "init_from": str(cfg.init_from) if cfg.init_from else None,
                                       "lr": ecfg.lr, "mlp": width},
                 cfg.out)
    features = Path(cfg.features) if cfg.features is not None else cfg.out / "features"
    store = extract_features(model, train_seqs + held_seqs, aux, features, ecfg.max_len, log,
                             teacher_top_k=teacher_top_k, target_sha256=target.sha256, shared=cfg.features is not None,
                             bf16=ecfg.bf16)
    scale = aux_scale(store, len(aux), seed=cfg.seed)
    if prior is None:
        kept = choose_vocab(train_seqs, model.config.vocab_size, vocab_size, target.stop_ids)
        head = init_head(model, head_config(model, aux, len(kept)), kept, scale)
    else:
        head, kept = prior, prior.draft_to_target.numpy()
        with torch.no_grad():  # the saved fc reads raw features; training feeds them scaled (fold_scale undone)
            head.fc.weight.div_(torch.from_numpy(scale)[None, :])
        log(f"head: starting from {cfg.init_from} (peak learning rate {ecfg.lr:g} after {ecfg.warmup} steps)")
        if vocab_size > head.c.draft_vocab:
            order = choose_vocab(train_seqs, model.config.vocab_size, model.config.vocab_size, target.stop_ids,
                                 ranked=True)
            extra = order[~head.t2d.numpy()[order]][:vocab_size - head.c.draft_vocab]
            log(f"head: draft vocabulary {head.c.draft_vocab:,} -> {vocab_size:,} tokens (the {len(extra):,} the "
                "target writes most among those it lacked; their rows start at the mean of the trained ones, so the "
                "head drafts what it did)")
            head = grow_vocab(head, extra)
            kept = head.draft_to_target.numpy()
    if width != head.c.intermediate:
        log(f"head: MLP {head.c.intermediate} -> {width} units"
            + (" (new units start silent: the head computes what it did)" if width > head.c.intermediate else ""))
        head = resize_mlp(head, width, seed=cfg.seed)
    covered = _coverage(held_seqs, kept)
    log(f"draft vocabulary: {len(kept):,} of {model.config.vocab_size:,} target tokens, covering {covered:.3%} of "
        "held-out answer tokens")
    feature_seconds = time.time() - t_start
    budget = None if seconds is None else max(60.0, seconds - feature_seconds)
    result = train_head(head, model.model.embed_tokens, train_seqs, held_seqs, store, scale, ecfg, ckpt, budget, log)
    fold_scale(head, scale)
    report = {
        "kind": "eagle3",
        "target": {"path": str(cfg.target), "sha256": target.sha256, "layers": n,
                   "hidden_size": model.config.hidden_size},
        "drafter": {"aux_layers": list(aux), "draft_vocab": len(kept), "draft_vocab_coverage": round(covered, 4),
                    "mlp": head.c.intermediate, "params_stored": sum(p.numel() for p in head.parameters())},
        "data": data_stats,
        "features_seconds": round(feature_seconds, 1),
        "init_from": _prior_summary(cfg.init_from) if cfg.init_from else None,
        "train": result,
        "seed": cfg.seed, "device": cfg.device, "precision": "bf16" if cfg.eagle.bf16 else "fp32",
        "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "processes": parallel.world(),
    }
    if not parallel.is_main():
        return report
    save_head(head, cfg.out, extra={"edge_spec_drafter": {
        "kind": "eagle3", "target_sha256": target.sha256, "target_layers": n, "seed": cfg.seed,
        "heldout": result["final"]}})
    (cfg.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    (cfg.out / "MODEL_CARD.md").write_text(render_eagle_card(report, cfg.command))
    fin = result["final"]
    log(f"saved EAGLE-3 head to {cfg.out} ({format_acceptance(fin)})")
    return report


def prior_head(path: Path, target: Target, aux: tuple[int, ...]) -> Eagle3Head:
    """The saved head at ``path`` to continue training; one sentence when it was made for another target."""
    if not (Path(path) / "config.json").is_file():
        raise EdgeSpecError(f"--init-from '{path}' is not an EAGLE-3 head directory (no config.json); pass the "
                            "--out directory of an earlier `edge-spec distill --kind eagle3` run.")
    raw = json.loads((Path(path) / "config.json").read_text())
    sha = (raw.get("edge_spec_drafter") or {}).get("target_sha256")
    if sha is not None and sha != target.sha256:
        raise EdgeSpecError(f"--init-from '{path}' was trained for another target (sha256 {sha[:12]}...); start "
                            "from a head of this target or leave --init-from out.")
    head = load_head(Path(path), target.model.config.num_hidden_layers)
    want = head_config(target.model, aux, head.c.draft_vocab)
    if dataclasses.replace(head.c, intermediate=want.intermediate) != want:  # --head-mlp may resize the MLP
        raise EdgeSpecError(f"--init-from '{path}' has another shape than this run's head (aux layers "
                            f"{list(head.c.aux_layers)}, hidden {head.c.hidden}); pass the same --aux-layers or "
                            "leave --init-from out.")
    return head


def _prior_summary(path: Path) -> dict:
    """What the starting head was: its path and the training recorded beside it."""
    report = Path(path) / "training.json"
    info = json.loads(report.read_text()) if report.is_file() else {}
    train = info.get("train") or {}
    return {"path": str(path), "steps": train.get("steps"), "seconds": train.get("seconds"),
            "train_tokens": (info.get("data") or {}).get("train_tokens")}


def _coverage(seqs: list[Sequence], kept: np.ndarray) -> float:
    inside = np.zeros(int(kept.max()) + 1, bool)
    inside[kept] = True
    tot = hit = 0
    for s in seqs:
        a = np.asarray(s.ids[s.prompt_len:], np.int64)
        tot += len(a)
        hit += int(inside[a[a < len(inside)]].sum())
    return hit / max(tot, 1)
