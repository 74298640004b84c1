"""Train an EAGLE-3 head for a target on two CPU cores: features recomputed once, training-time test, soft CE.

Data are the target's own answers (``data.py`` shards: token ids + the teacher's top-k logits at every answer
position). The target's aux features are *recomputed* by one teacher-forced pass (no LM head) instead of being
generated with the text and stored — forward passes are 2.5x faster than generation and the ids stay the durable
asset — and kept in float16 memory maps (``features.py``: per-sequence segments, 2 * 3T bytes per position).

Loss: at every answer position and every draft depth d = 1..depth, the forward KL from the teacher's top-k
distribution (renormalised over the draft vocabulary) to the head's softmax, weighted 0.8^(d-1) (EAGLE-3). Depth d
runs exactly as the runtime's d-th draft step (``Eagle3Head.forward_chain``).

Held-out (the target's T=0 and T=0.7 answers to evaluation prompts), printed as it trains:
* greedy acceptance at depth d = P(argmax q_d == argmax p) given the d - 1 earlier drafts were right;
* T=0.7 acceptance at depth d = E[sum_x min(p_0.7(x), q_0.7(x))] over the teacher's top-k (a lower bound).

Deterministic for a seed on one machine and thread count; checkpointed every few minutes and resumable. The head it
starts from (vocabulary, initialisation, a continued head's surgery) is ``eagle_init.py``'s. Under ``torchrun`` each
rank takes its share of every step's batch and of the held-out set (``parallel.py``): the same steps up to float
reduction order, with any number of processes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edge_spec.distill import parallel
from edge_spec.distill.eagle import Eagle3Head
from edge_spec.distill.features import FeatureStore
from edge_spec.distill.memory import TRIM_EVERY, release_freed
from edge_spec.distill.sequence import EVAL_TEMPERATURE, Sequence
from edge_spec.distill.train import REPLAN_EVERY


@dataclass(frozen=True)
class EagleTrainConfig:
    """Training settings; ``steps`` fixes the step count (reproducible), else the time budget sets it."""

    seed: int = 0
    steps: int | None = None
    batch_seqs: int = 8
    max_len: int = 320
    lr: float = 5e-4
    warmup: int = 20
    # continuing a trained head (--init-from): a fresh optimiser at the full rate undid ~300 steps of it (held-out
    # 0.490 -> 0.475 at step 100, back only at step 300; BENCHMARKS.md), so a lower peak after a longer warm-up
    continue_lr: float = 1.5e-4
    continue_warmup: int = 100
    depth: int = 3  # training-time-test steps (the draft depths the runtime will use most)
    depth_decay: float = 0.8
    draft_vocab: int | None = None  # None: 8,192 for a fresh head, the --init-from head's own size for a continued one
    eval_every: int = 100
    eval_depth: int = 4
    checkpoint_seconds: float = 300.0
    eval_batch: int = 16
    mlp: int | None = None  # the head's MLP width (units); None: the target's (a fresh head) or the --init-from head's
    bf16: bool = False  # training steps' matmuls under bfloat16 autocast (run.train_precision); evaluations fp32
    eval_tokens: int = 24_000  # answer tokens of the held-out sequences evaluated during training (all at the end)


# ---------------------------------------------------------------------------------------------- batches
def target_to_draft(head: Eagle3Head) -> np.ndarray:
    """[target vocab] int64: each target id's draft id, -1 for a token outside the head's draft vocabulary."""
    t2d = np.full(head.c.vocab, -1, np.int64)
    t2d[head.draft_to_target.numpy()] = np.arange(head.c.draft_vocab)
    return t2d


def _batch(seqs: list[Sequence], idx: np.ndarray, store: FeatureStore, t2d: np.ndarray, max_len: int,
           embed: torch.nn.Module, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """Drafter rows q = 0..S-2 of each sequence: next-token embeddings, scaled features, teacher rows.

    The head's output at q predicts ids[q + 2], whose teacher row is answer row r = q + 2 - prompt_len."""
    n = [min(len(seqs[i].ids), max_len) for i in idx]
    s = max(n) - 1
    b = len(idx)
    k = seqs[idx[0]].topk_ids.shape[1]
    ids = np.zeros((b, s), np.int64)
    feats = np.zeros((b, s, store.dim), np.float32)
    t_ids = np.zeros((b, s, k), np.int64)
    t_logits = np.zeros((b, s, k), np.float32)  # rows outside the answers are masked
    lse = np.zeros((b, s), np.float32)
    valid = np.zeros((b, s), bool)
    temp = np.zeros(b, np.float32)
    for r, i in enumerate(idx):
        seq, m = seqs[i], n[r] - 1
        ids[r, :m] = seq.ids[1:m + 1]
        feats[r, :m] = store.get(i, m)
        temp[r] = seq.temp
        q0 = max(seq.prompt_len - 2, 0)  # first q whose target x_{q+2} is an answer token
        q1 = min(m, seq.prompt_len - 2 + len(seq.topk_ids))
        if q1 > q0:
            rows = np.arange(q0, q1) + 2 - seq.prompt_len
            t_ids[r, q0:q1] = seq.topk_ids[rows]
            t_logits[r, q0:q1] = seq.topk_logits[rows].astype(np.float32)
            lse[r, q0:q1] = seq.lse[rows, 1]
            valid[r, q0:q1] = True
    d_ids = t2d[t_ids]  # [b, s, k] draft ids, -1 outside the draft vocabulary
    with torch.no_grad():
        e = embed(torch.from_numpy(ids))
    return {"e": e, "f": torch.from_numpy(feats) * scale, "t_ids": torch.from_numpy(t_ids),
            "d_ids": torch.from_numpy(d_ids), "t_logits": torch.from_numpy(t_logits), "lse": torch.from_numpy(lse),
            "valid": torch.from_numpy(valid), "temp": torch.from_numpy(temp)}


def _rows(batch: dict[str, torch.Tensor], depth: int) -> torch.Tensor:
    """[depth] the answer rows the loss counts at each depth (depth d skips each sequence's first d rows)."""
    return torch.stack([batch["valid"][:, d:].sum() for d in range(depth)])


def _loss(head: Eagle3Head, outs: list, batch: dict[str, torch.Tensor], decay: float,
          rows: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over depths of decay^d * mean forward KL (teacher top-k restricted to the draft vocabulary).

    The LM head (half of a step's work) runs on the answer rows only: prompt rows are context. ``rows`` [depth]:
    divide each depth's sum by these counts (the global batch's, :func:`_rows` added over the ranks) instead of
    this batch's own."""
    p = torch.softmax(batch["t_logits"], -1)
    inside = batch["d_ids"] >= 0
    p = p * inside
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    gather = batch["d_ids"].clamp_min(0)
    total = torch.zeros(())
    for d, (h, _) in enumerate(outs):
        mask = batch["valid"].clone()
        mask[:, :d] = False
        logq = F.log_softmax(head.logits(h[mask]).float(), -1).gather(-1, gather[mask])  # [rows, k]
        ce = -(p[mask] * logq).sum(-1)
        total = total + decay ** d * ce.sum() / (mask.sum() if rows is None else rows[d]).clamp_min(1)
    return total


@torch.no_grad()
def evaluate(head: Eagle3Head, embed: torch.nn.Module, held: list[Sequence], store: FeatureStore, base: int,
             t2d: np.ndarray, scale: torch.Tensor, cfg: EagleTrainConfig,
             tokens: int | None = None) -> dict[str, list[float] | int]:
    """Held-out greedy and T=0.7 acceptance at depths 1..eval_depth (see the module docstring).

    ``tokens``: evaluate only a fixed seeded sample of held-out sequences holding about that many answer tokens
    (every data file represented), so evaluations during training cost a fraction of the final one. Each rank
    evaluates every world-th chunk of ``cfg.eval_batch`` sequences; the counts are added over the ranks."""
    order = np.arange(len(held))
    if tokens is not None:
        order = np.random.default_rng(1234).permutation(len(held))
        answer = np.cumsum([len(held[i].ids) - held[i].prompt_len for i in order])
        order = np.sort(order[:max(1, int(np.searchsorted(answer, tokens)) + 1)])
    head.eval()
    d2t = head.draft_to_target
    hit = np.zeros(cfg.eval_depth)
    hit_n = np.zeros(cfg.eval_depth)
    acc = np.zeros(cfg.eval_depth)
    acc_n = np.zeros(cfg.eval_depth)
    for i in range(cfg.eval_batch * parallel.rank(), len(order), cfg.eval_batch * parallel.world()):
        idx = order[i:i + cfg.eval_batch]
        batch = _batch(held, idx, _Offset(store, base), t2d, cfg.max_len, embed, scale)
        outs = head.forward_chain(batch["e"], batch["f"], cfg.eval_depth)
        greedy = (batch["temp"] == 0)[:, None]
        warm = (batch["temp"] == EVAL_TEMPERATURE)[:, None]
        p07 = torch.exp(batch["t_logits"] / EVAL_TEMPERATURE - batch["lse"][..., None])  # [b, s, k]
        for d, (_, logits) in enumerate(outs):
            mask = batch["valid"].clone()
            mask[:, :d] = False
            top = d2t[logits.argmax(-1)] == batch["t_ids"][..., 0]
            hit[d] += float((top & mask & greedy).sum())
            hit_n[d] += float((mask & greedy).sum())
            q07 = torch.softmax(logits.float() / EVAL_TEMPERATURE, -1).gather(-1, batch["d_ids"].clamp_min(0))
            q07 = q07 * (batch["d_ids"] >= 0)
            a = torch.minimum(p07, q07).sum(-1)
            acc[d] += float(torch.where(mask & warm, a, 0.0).sum())
            acc_n[d] += float((mask & warm).sum())
    hit, hit_n, acc, acc_n = parallel.total(torch.from_numpy(np.stack([hit, hit_n, acc, acc_n]))).numpy()
    head.train()
    return {"greedy": [round(float(x), 4) for x in hit / np.maximum(hit_n, 1)],
            "t07": [round(float(x), 4) for x in acc / np.maximum(acc_n, 1)],
            "greedy_positions": int(hit_n[0]), "t07_positions": int(acc_n[0])}


class _Offset:
    """A FeatureStore view whose sequence i is the store's sequence base + i (held-out rows follow training)."""

    def __init__(self, store: FeatureStore, base: int) -> None:
        self.store, self.base, self.dim = store, base, store.dim

    def get(self, i: int, n: int) -> np.ndarray:
        return self.store.get(self.base + i, n)


# ---------------------------------------------------------------------------------------------- the loop
def _lr(cfg: EagleTrainConfig, step: int, planned: int) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup)
    return cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / max(planned, 1), 1.0))))


def train_head(head: Eagle3Head, embed: torch.nn.Module, train: list[Sequence], held: list[Sequence],
               store: FeatureStore, scale: np.ndarray, cfg: EagleTrainConfig, ckpt_dir: Path, seconds: float | None,
               log: Callable[[str], None] = print) -> dict:
    """Train in place until ``cfg.steps`` (or ``seconds``); resume from ``ckpt_dir``; returns the report.

    ``store`` holds the training sequences' features first, then the held-out ones'."""
    t2d = target_to_draft(head)
    sc = torch.from_numpy(scale)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, planned, spent, history, losses = 0, cfg.steps, 0.0, [], []
    state_file = ckpt_dir / "state.pt"
    parallel.same_params(head)
    state = parallel.from_main(torch.load(state_file, weights_only=False, map_location="cpu")
                               if parallel.is_main() and state_file.exists() else None)
    if state is not None:
        head.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, planned, spent, history = state["step"], state["planned"], state["seconds"], state["history"]
        losses = state.get("losses", [])
        log(f"train: resumed at step {step} ({spent / 60:.1f} min done)" + parallel.world_note(state.get("world", 1)))
    per_epoch = max(1, len(train) // cfg.batch_seqs)
    t0 = t_ckpt = t_log = time.time()
    done_here = 0
    eval_seconds = 0.0  # one held-out evaluation: the step count planned from the budget leaves room for them
    if not history:
        history.append({"step": 0, **evaluate(head, embed, held, store, len(train), t2d, sc, cfg, cfg.eval_tokens)})
        eval_seconds = time.time() - t0
        log(f"train: step 0 {format_acceptance(history[-1])}")
    t_steps = time.time()  # the step rate is measured on training steps only
    budgeted = seconds is not None and cfg.steps is None  # a time budget sets (and keeps re-setting) the step count
    while planned is None or step < planned:
        elapsed = time.time() - t0
        if budgeted and done_here >= 5 and (planned is None or done_here % REPLAN_EVERY == 0):
            # steps slow down as the run goes (longer batches, a warm machine): the first 5 steps' rate planned a
            # 60-minute run 9 % too long, so the count is re-planned from the rate so far, evaluations included,
            # keeping one evaluation's time for the final one
            evals_inside = done_here >= cfg.eval_every
            rate = (time.time() - t_steps) / done_here + (0.0 if evals_inside else eval_seconds / cfg.eval_every)
            new = parallel.from_main(step + max(1, int((seconds - spent - elapsed - eval_seconds) / rate)))
            if planned is None or abs(new - planned) > 0.02 * planned:
                log(f"train: {rate:.2f} s/step (evaluations included) -> {new} steps in "
                    f"{(seconds - spent) / 60:.1f} min")
            planned = new
        if planned is None and seconds is not None and parallel.from_main(spent + elapsed >= seconds):
            break
        order = np.random.default_rng([cfg.seed, step // per_epoch]).permutation(len(train))
        j = step % per_epoch
        idx = order[j * cfg.batch_seqs:(j + 1) * cfg.batch_seqs]
        idx = idx[parallel.mine(len(idx))]  # this rank's share of the step's global batch (all of it alone)
        batch = _batch(train, idx, store, t2d, cfg.max_len, embed, sc) if len(idx) else None
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, planned or 1000)
        opt.zero_grad(set_to_none=True)
        # one process: each depth's mean; several: each depth's sum over the global batch's row count (a rank
        # without sequences, when the batch is smaller than the job, adds zeros)
        mine_rows = _rows(batch, cfg.depth) if batch is not None else torch.zeros(cfg.depth, dtype=torch.int64)
        rows = parallel.total(mine_rows) if parallel.world() > 1 else None
        loss = torch.zeros(())
        if batch is not None:
            with torch.autocast(head.fc.weight.device.type, torch.bfloat16, enabled=cfg.bf16):
                loss = _loss(head, head.forward_chain(batch["e"], batch["f"], cfg.depth, with_logits=False), batch,
                             cfg.depth_decay, rows)
            loss.backward()
        loss_value = float(parallel.sum_grads(params, loss.detach().float()))  # the global batch's loss
        losses.append(round(loss_value, 6))
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        done_here += 1
        if step % TRIM_EVERY == 0:
            release_freed()  # batches of ever-changing shapes fragment the heap (distill/memory.py)
        if step % cfg.eval_every == 0 or step == planned:
            history.append({"step": step, "loss": round(loss_value, 4),
                            "minutes": round((spent + time.time() - t0) / 60, 2),
                            **evaluate(head, embed, held, store, len(train), t2d, sc, cfg, cfg.eval_tokens)})
            log(f"train: step {step} {format_acceptance(history[-1])}")
        if time.time() - t_log > 30:
            t_log = time.time()
            eta = (time.time() - t0) / done_here * ((planned or step) - step) / 60
            bar = "#" * int(20 * step / max(planned or step, 1))
            log(f"train {step}/{planned or '?'} [{bar:<20}] loss {loss_value:.3f}, ETA {eta:.1f} min")
        if parallel.is_main() and (time.time() - t_ckpt > cfg.checkpoint_seconds or step == planned):
            _save(ckpt_dir, {"model": head.state_dict(), "opt": opt.state_dict(), "step": step, "planned": planned,
                             "seconds": spent + time.time() - t0, "history": history, "losses": losses,
                             "world": parallel.world()})
            t_ckpt = time.time()
    with torch.no_grad():  # measure what is saved: fp16 weights
        for p in params:
            p.copy_(p.half().float())
    final = evaluate(head, embed, held, store, len(train), t2d, sc, cfg)
    return {"config": asdict(cfg), "steps": step, "seconds": round(spent + time.time() - t0, 1),
            "processes": parallel.world(), "history": history, "losses": losses, "final": final}


def _save(path: Path, state: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / "state.pt.tmp")
    os.replace(path / "state.pt.tmp", path / "state.pt")


def format_acceptance(m: dict) -> str:
    g = " / ".join(f"{x:.3f}" for x in m["greedy"])
    t = " / ".join(f"{x:.3f}" for x in m["t07"]) if m.get("t07_positions") else "not measured (no sampled answer)"
    return f"held-out acceptance by depth: greedy {g}; T=0.7 {t}" + (f"; loss {m['loss']:.3f}" if "loss" in m else "")
