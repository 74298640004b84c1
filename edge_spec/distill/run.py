"""The distill pipeline: load the target, generate (or reuse) its text, train, save. Resumable from DRAFTER_DIR.

Under ``torchrun`` every rank runs this same pipeline on its share of each stage (``parallel.py``); rank 0 alone logs
and writes the drafter, its report and checkpoints."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from edge_spec.distill import ids as ids_mod
from edge_spec.distill import parallel
from edge_spec.distill.card import render_card
from edge_spec.distill.config import DistillConfig, answer_files, check_marker
from edge_spec.distill.data import generate_data, generate_eval, shard_seconds
from edge_spec.distill.drafter import build_drafter, save_drafter, spread_layers
from edge_spec.distill.eagle_run import prior_head, run_aux_layers, train_eagle
from edge_spec.distill.eagle_train import EagleTrainConfig
from edge_spec.distill.features import FeatureWriter
from edge_spec.distill.memory import cap_primitive_cache
from edge_spec.distill.prompts import read_prompt_file
from edge_spec.distill.sequence import load_sequences
from edge_spec.distill.target import load_target
from edge_spec.distill.train import train
from edge_spec.errors import EdgeSpecError


def check_device(device: str) -> str:
    """``cpu`` or ``cuda``; one sentence when CUDA is asked for and absent."""
    if device not in ("cpu", "cuda"):
        raise EdgeSpecError(f"--device '{device}' is not supported; use cpu or cuda.")
    if device == "cuda" and not torch.cuda.is_available():
        raise EdgeSpecError("--device cuda was given but this torch build sees no CUDA GPU; use --device cpu or "
                            "install a CUDA build of torch.")
    return device


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo's flags)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to tell cheaply, so no
        return False
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def train_precision(precision: str, device: str) -> str:
    """``bf16`` (matmuls under bfloat16 autocast; weights, optimiser and loss stay float32) or ``fp32``.

    ``auto``: bf16 on a CPU that multiplies bfloat16 natively (a training step of the SmolLM2 head ran 1.9x faster,
    BENCHMARKS.md), fp32 elsewhere (a CPU without it would emulate bf16 slowly; GPUs keep today's fp32).
    It applies to the drafter's training steps and to the target's generation and feature passes
    (``target.bf16_body``: ~1.6x the tokens and ~1.5x the feature positions per second, its LM head in fp32, so the
    teacher's logits carry no bfloat16 rounding of their own); held-out evaluations stay float32."""
    if precision not in ("auto", "fp32", "bf16"):
        raise EdgeSpecError(f"--precision '{precision}' is not known; use auto, fp32 or bf16.")
    if precision != "auto":
        return precision
    return "bf16" if device == "cpu" and cpu_has_bf16() else "fp32"


def distill(cfg: DistillConfig, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) a distillation; return the report also written to DRAFTER_DIR/training.json.

    Started by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment), this process joins the job's other ranks for
    the run (``parallel.py``) and only rank 0 calls ``log``."""
    device = check_device(cfg.device)
    parallel.start(device)
    return _distill(cfg, device, log if parallel.is_main() else _silent)


def _silent(msg: str) -> None:
    """The log of a rank other than 0: rank 0 speaks for the job."""


def _distill(cfg: DistillConfig, device: str, log: Callable[[str], None]) -> dict:
    cap_primitive_cache()  # before the first bf16 matmul (distill/memory.py)
    precision = train_precision(cfg.precision, device)
    cfg = replace(cfg, train=replace(cfg.train, bf16=precision == "bf16"),
                  eagle=replace(cfg.eagle, bf16=precision == "bf16"))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    data_cfg = replace(cfg.data, seed=cfg.seed, bf16=precision == "bf16")
    if cfg.prompts_file is not None:
        data_cfg = replace(data_cfg, extra_prompts=tuple(read_prompt_file(Path(cfg.prompts_file))))
    log(f"target: loading {cfg.target}")
    if cfg.kind not in ("layers", "eagle3"):
        raise EdgeSpecError(f"--kind '{cfg.kind}' is not known; use layers or eagle3.")
    if cfg.features is not None and cfg.kind != "eagle3":
        raise EdgeSpecError("--features keeps the target's hidden states for an EAGLE-3 head; add --kind eagle3 or "
                            "leave --features out.")
    if cfg.eagle.mlp is not None and cfg.kind != "eagle3":
        raise EdgeSpecError("--head-mlp sets the width of an EAGLE-3 head; add --kind eagle3 or leave it out.")
    if cfg.eagle.draft_vocab is not None and cfg.kind != "eagle3":
        raise EdgeSpecError("--draft-vocab sets an EAGLE-3 head's vocabulary; add --kind eagle3 or leave it out (a "
                            "layer drafter's vocabulary is trimmed at export: edge-spec export --trim-vocab).")
    if cfg.eagle.depth != EagleTrainConfig.depth and cfg.kind != "eagle3":
        raise EdgeSpecError("--ttt-depth sets the draft depths an EAGLE-3 head trains at; add --kind eagle3 or leave "
                            "it out.")
    if cfg.init_from is not None and cfg.kind != "eagle3":
        raise EdgeSpecError("--init-from continues an EAGLE-3 head; add --kind eagle3 (a layer drafter resumes from "
                            "its own --out directory).")
    target = load_target(cfg.target, device)
    n_target = target.model.config.num_hidden_layers
    layers_from = list(cfg.layers_from) if cfg.layers_from else spread_layers(n_target, cfg.layers)
    if any(not 0 <= i < n_target for i in layers_from):
        raise EdgeSpecError(f"layers_from {layers_from} names a layer the target lacks; use 0 to {n_target - 1}.")
    meta = {"target_sha256": target.sha256, "seed": cfg.seed,
            "data": {k: v for k, v in asdict(data_cfg).items()
                     # these do not change which shards are written (each shard's sidecar records its precision)
                     if k not in ("extra_prompts", "max_jobs", "eval_prompts", "bf16")},
            "extra_prompts": len(data_cfg.extra_prompts)}
    # --init-from: read (and refuse an unusable head) before anything is written to --out
    prior = prior_head(cfg.init_from, target, run_aux_layers(cfg, n_target)) if cfg.init_from is not None else None
    check_marker(cfg.out / "distill.json", meta, cfg.out)
    if cfg.kind == "layers" and not cfg.data_only:
        check_marker(cfg.out / "checkpoint" / "train.json", {"layers_from": layers_from, "lr": cfg.train.lr},
                     cfg.out)
    what = f"drafter from layers {layers_from}" if cfg.kind == "layers" else "an EAGLE-3 head"
    log(f"target: {n_target} layers, hidden {target.model.config.hidden_size}, sha256 {target.sha256[:16]}; {what}")

    answers = answer_files(cfg.answers)
    if answers:  # ids only: the teacher's targets are recomputed, nothing is generated
        train_seqs, held_seqs, info = ids_mod.read_many(answers)
        if train_seqs and not held_seqs and not cfg.data_only:  # files marking none held out: hold out prompts
            train_seqs, held_seqs = ids_mod.split_heldout(train_seqs, data_cfg.heldout_percent)
            log(f"data: the answers files mark no held-out answers; holding out {len(held_seqs)} of "
                f"{len(train_seqs) + len(held_seqs)} by a hash of their prompts ({data_cfg.heldout_percent} %)")
        if info.get("target_sha256") not in (None, target.sha256):
            raise EdgeSpecError(f"'{answers[0]}' holds answers written by another target (sha256 "
                                f"{str(info['target_sha256'])[:12]}...); pass the answers of '{cfg.target}'.")
        if cfg.data_only and parallel.is_main():  # merging answers files: write the union, the durable form, stop
            (cfg.out / "data").mkdir(parents=True, exist_ok=True)
            ids_mod.pack(train_seqs, held_seqs, cfg.out / "data" / "answers.npz",
                         {"target_sha256": target.sha256, "generation_seconds": info["generation_seconds"],
                          "merged": info["files"]})
        elif cfg.kind != "eagle3":  # an EAGLE-3 run fills them in its feature pass (one pass, not two)
            ids_mod.teacher_targets(target.model, train_seqs + held_seqs, data_cfg.top_k, log=log)
        shards, data_seconds = list(answers), 0.0
    else:
        data_budget = cfg.minutes * 60 * cfg.data_share if cfg.minutes else None
        # an EAGLE-3 head reads the target's features of this text: kept as it is written, no pass over it later
        writer = None if cfg.kind != "eagle3" or cfg.data_only else FeatureWriter(
            Path(cfg.features) if cfg.features is not None else cfg.out / "features",
            run_aux_layers(cfg, n_target), cfg.eagle.max_len, target.sha256)
        shards = generate_data(target, data_cfg, cfg.out / "data", data_budget, log, writer)
        shards += generate_eval(target, data_cfg, cfg.out / "data", log, writer)
        data_seconds = shard_seconds(cfg.out / "data")
        train_seqs, held_seqs = load_sequences(shards)
        packed = cfg.out / "data" / "answers.npz"
        if train_seqs and held_seqs and not packed.exists() and parallel.is_main():  # the durable, compact form
            ids_mod.pack(train_seqs, held_seqs, packed, {"target_sha256": target.sha256,
                                                         "generation_seconds": round(data_seconds, 1),
                                                         "shards": [p.name for p in shards]})
    parallel.agree(_fingerprint(train_seqs, held_seqs), "training data")
    if not train_seqs or not held_seqs:
        raise EdgeSpecError(f"The generated data in '{cfg.out / 'data'}' has {len(train_seqs)} training and "
                            f"{len(held_seqs)} held-out answers; give distill more --minutes (or more prompts).")
    data_stats = _data_stats(train_seqs, held_seqs, shards, data_seconds)
    if answers:
        data_stats["answers"] = {"files": info["files"], "generation_seconds": info.get("generation_seconds")}
    log(f"data: {data_stats['train_tokens']:,} training / {data_stats['heldout_tokens']:,} held-out answer tokens "
        f"from {len(shards)} shards ({data_seconds:.0f}s of generation)")
    if cfg.data_only:
        return {"data": data_stats}

    # Generation time counts across resumed runs (it is stored with the shards, summed over the processes that
    # wrote them: their wall time is that over the processes now); loading does not.
    train_budget = max(60.0, cfg.minutes * 60 - data_seconds / parallel.world()) if cfg.minutes else None
    if parallel.world() > 1:
        batch = cfg.eagle.batch_seqs if cfg.kind == "eagle3" else cfg.train.batch_seqs
        log(f"train: {parallel.world()} processes share each step's {batch} sequences"
            + (" (some have none: pass a larger --train-batch)" if batch < parallel.world() else ""))
    if cfg.kind == "eagle3":
        return train_eagle(cfg, target, train_seqs, held_seqs, data_stats, train_budget, log,
                           teacher_top_k=data_cfg.top_k if answers else None, prior=prior)
    drafter = build_drafter(target.model, layers_from)
    result = train(drafter, train_seqs, held_seqs, replace(cfg.train, seed=cfg.seed), cfg.out / "checkpoint",
                   train_budget, log)
    report = {
        "target": {"path": str(cfg.target), "sha256": target.sha256, "layers": n_target,
                   "hidden_size": target.model.config.hidden_size},
        "drafter": {"layers": len(layers_from), "layers_from": layers_from,
                    "params_stored": sum(p.numel() for n, p in drafter.named_parameters()
                                         if n not in ("model.embed_tokens.weight", "lm_head.weight")),
                    "params_shared": target.model.model.embed_tokens.weight.numel()},
        "data": data_stats,
        "train": result,
        "seed": cfg.seed,
        "device": device,
        "precision": precision,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "processes": parallel.world(),
    }
    if not parallel.is_main():
        return report
    save_drafter(drafter, cfg.out, {"target_sha256": target.sha256, "layers_from": layers_from,
                                    "target_layers": n_target, "seed": cfg.seed,
                                    "heldout": result["final"]})
    (cfg.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    (cfg.out / "MODEL_CARD.md").write_text(render_card(report, cfg.command))
    log(f"saved drafter to {cfg.out} (held-out greedy agreement {result['final']['greedy_agreement']:.3f}, "
        f"T=0.7 expected acceptance {result['final']['accept_t07']:.3f})")
    return report


def _fingerprint(train_seqs: list, held_seqs: list) -> str:
    """A hash of the sequences' ids in order: what the ranks of a job must agree on before they train."""
    h = hashlib.sha256()
    for s in train_seqs + held_seqs:
        h.update(np.int64(s.prompt_len).tobytes())
        h.update(np.asarray(s.ids, np.int32).tobytes())
    return h.hexdigest()


def _data_stats(train_seqs: list, held_seqs: list, shards: list[Path], seconds: float) -> dict:
    def answer_tokens(seqs: list, temp: float | None = None) -> int:
        return sum(len(s.ids) - s.prompt_len for s in seqs if temp is None or s.temp == temp)

    return {"shards": len(shards), "generation_seconds": seconds,
            "train_sequences": len(train_seqs), "heldout_sequences": len(held_seqs),
            "train_tokens": answer_tokens(train_seqs), "heldout_tokens": answer_tokens(held_seqs),
            "train_tokens_by_temperature": {str(t): answer_tokens(train_seqs, t) for t in (0.0, 0.7, 1.0)},
            "heldout_tokens_by_temperature": {str(t): answer_tokens(held_seqs, t) for t in (0.0, 0.7, 1.0)}}
