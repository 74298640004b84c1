"""Train the drafter on the target's distributions (DistillSpec: match p itself, not only its samples).

Loss at every answer position: forward KL from the teacher's renormalised top-k distribution to the
drafter's full softmax, ``-sum_i p̂_i log q_i`` (+ the constant ``sum p̂ log p̂`` so it reads as a KL),
optionally mixed with cross-entropy on the token the target actually wrote. The LM head runs only at
answer positions; prompt positions are context.

Held-out proxies of speculative acceptance, measured in torch against the fp32 target's stored logits:
* greedy agreement = P(argmax q = argmax p) on the target's T=0 answers — greedy acceptance per token;
* T=0.7 expected acceptance = E[sum_x min(p_0.7(x), q_0.7(x))] on the T=0.7 answers, summed over the
  teacher's top-k (a lower bound: the exact sum is at most ``p_tail`` higher, reported with it).

Deterministic: the batch order is a function of (seed, step), the optimizer state is checkpointed, so a
resumed run repeats the uninterrupted one bit for bit on the same machine and thread count. Under ``torchrun`` each
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
from edge_spec.distill.drafter import trainable_state
from edge_spec.distill.memory import TRIM_EVERY, release_freed
from edge_spec.distill.sequence import EVAL_TEMPERATURE, Sequence

REPLAN_EVERY = 50  # training steps between re-plans of a time-budgeted run's step count


@dataclass(frozen=True)
class TrainConfig:
    """Training settings; ``steps`` fixes the step count (reproducible), else the time budget sets it."""

    seed: int = 0
    steps: int | None = None
    batch_seqs: int = 8
    max_len: int = 512
    lr: float = 5e-4
    warmup: int = 10
    ce_weight: float = 0.0
    eval_every: int = 50
    checkpoint_seconds: float = 300.0
    eval_batch: int = 16
    bf16: bool = False  # training steps' matmuls under bfloat16 autocast (run.train_precision)


def _batch(seqs: list[Sequence], max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded ids [B, L], mask [B, L], answer positions (b, t) and their teacher rows [N, k]."""
    seqs = [s for s in seqs if s.prompt_len < max_len]
    width = min(max_len, max(len(s.ids) for s in seqs))
    ids = np.zeros((len(seqs), width), np.int64)
    mask = np.zeros((len(seqs), width), np.int64)
    rows_b, rows_t, tk_i, tk_v, lse, nxt = [], [], [], [], [], []
    for b, s in enumerate(seqs):
        n = min(len(s.ids), width)
        ids[b, :n], mask[b, :n] = s.ids[:n], 1
        m = n - s.prompt_len  # answer tokens kept; position prompt_len-1+t predicts answer token t
        rows_b.append(np.full(m, b))
        rows_t.append(np.arange(s.prompt_len - 1, s.prompt_len - 1 + m))
        tk_i.append(s.topk_ids[:m])
        tk_v.append(s.topk_logits[:m])
        lse.append(s.lse[:m])
        nxt.append(s.ids[s.prompt_len:n])
    cat = np.concatenate
    return {"ids": torch.from_numpy(ids), "mask": torch.from_numpy(mask),
            "b": torch.from_numpy(cat(rows_b)), "t": torch.from_numpy(cat(rows_t)),
            "topk_ids": torch.from_numpy(cat(tk_i).astype(np.int64)),
            "topk_logits": torch.from_numpy(cat(tk_v).astype(np.float32)),
            "lse": torch.from_numpy(cat(lse)), "next": torch.from_numpy(cat(nxt).astype(np.int64))}


def _answer_logits(drafter: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Drafter logits [N, V] at the answer positions only (the LM head is most of the cost)."""
    dev = next(drafter.parameters()).device
    hidden = drafter.model(input_ids=batch["ids"].to(dev), attention_mask=batch["mask"].to(dev)).last_hidden_state
    return drafter.lm_head(hidden[batch["b"].to(dev), batch["t"].to(dev)]).float()


def _kd_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor], ce_weight: float,
             rows: int | None = None) -> torch.Tensor:
    """Mean over answer rows of the KD loss; ``rows``: divide the rows' sum by this count instead (the global
    batch's rows when each rank holds a part of it)."""
    dev = logits.device
    logq = F.log_softmax(logits, -1)  # [N, V]
    p_hat = F.softmax(batch["topk_logits"].to(dev), -1)  # [N, k] renormalised teacher top-k
    per_row = (p_hat * (p_hat.clamp_min(1e-30).log() - logq.gather(1, batch["topk_ids"].to(dev)))).sum(-1)
    if rows is None:
        kl = per_row.mean()
        if ce_weight:
            kl = kl + ce_weight * F.nll_loss(logq, batch["next"].to(dev))
        return kl
    kl = per_row.sum() / rows
    if ce_weight:
        kl = kl + ce_weight * F.nll_loss(logq, batch["next"].to(dev), reduction="sum") / rows
    return kl


@torch.no_grad()
def evaluate(drafter: torch.nn.Module, held: list[Sequence], cfg: TrainConfig) -> dict[str, float]:
    """Held-out greedy agreement (T=0 answers), T=0.7 expected acceptance (T=0.7 answers), KD loss (all).

    Each rank evaluates every world-th chunk of ``cfg.eval_batch`` sequences; the sums are added over the ranks."""
    drafter.eval()
    sums = {"agree": 0.0, "agree_n": 0, "acc": 0.0, "tail": 0.0, "acc_n": 0, "agree_all": 0.0, "loss": 0.0, "n": 0}
    step = cfg.eval_batch * parallel.world()
    for i in range(cfg.eval_batch * parallel.rank(), len(held), step):
        chunk = held[i:i + cfg.eval_batch]
        batch = _batch(chunk, cfg.max_len)
        logits = _answer_logits(drafter, batch)
        temps = torch.tensor([s.temp for s in chunk if s.prompt_len < cfg.max_len])[batch["b"]]
        hit = (logits.argmax(-1).cpu() == batch["topk_ids"][:, 0]).double()
        p07 = torch.exp(batch["topk_logits"] / EVAL_TEMPERATURE - batch["lse"][:, 1:2])  # [N, k] exact p_0.7
        q07 = torch.softmax(logits / EVAL_TEMPERATURE, -1).gather(1, batch["topk_ids"].to(logits.device)).cpu()
        acc = torch.minimum(p07, q07).sum(-1).double()
        greedy, warm = temps == 0.0, temps == EVAL_TEMPERATURE
        sums["agree"] += float(hit[greedy].sum())
        sums["agree_n"] += int(greedy.sum())
        sums["acc"] += float(acc[warm].sum())
        sums["tail"] += float((1 - p07.sum(-1))[warm].double().sum())
        sums["acc_n"] += int(warm.sum())
        sums["agree_all"] += float(hit.sum())
        sums["loss"] += float(_kd_loss(logits, batch, 0.0)) * len(hit)
        sums["n"] += len(hit)
    added = parallel.total(torch.tensor(list(sums.values()), dtype=torch.float64)).tolist()
    sums = {k: (int(v) if k.endswith("_n") or k == "n" else v) for k, v in zip(sums, added, strict=True)}
    drafter.train()
    return {"greedy_agreement": sums["agree"] / max(sums["agree_n"], 1), "greedy_positions": sums["agree_n"],
            "accept_t07": sums["acc"] / max(sums["acc_n"], 1),
            "accept_t07_p_tail": sums["tail"] / max(sums["acc_n"], 1),
            "t07_positions": sums["acc_n"], "agreement_all": sums["agree_all"] / max(sums["n"], 1),
            "kd_loss": sums["loss"] / max(sums["n"], 1)}


def _order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def _lr(cfg: TrainConfig, step: int, planned: int) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup)
    return cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / max(planned, 1), 1.0))))


def _save(path: Path, state: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / "state.pt.tmp")
    os.replace(path / "state.pt.tmp", path / "state.pt")


def train(drafter: torch.nn.Module, train_seqs: list[Sequence], held: list[Sequence], cfg: TrainConfig,
          ckpt_dir: Path, seconds: float | None, log: Callable[[str], None] = print) -> dict:
    """Train in place until ``cfg.steps`` (or the ``seconds`` budget); resume from ``ckpt_dir`` when it holds a state.

    Returns the report: steps, seconds, eval history, final held-out metrics (weights rounded to fp16 first,
    the precision they are saved in)."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, planned, spent, history, losses = 0, cfg.steps, 0.0, [], []
    parallel.same_params(drafter)
    state = parallel.from_main(torch.load(ckpt_dir / "state.pt", weights_only=False, map_location="cpu")
                               if parallel.is_main() and (ckpt_dir / "state.pt").exists() else None)
    if state is not None:
        drafter.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["opt"])
        step, planned, spent, history = state["step"], state["planned"], state["seconds"], state["history"]
        losses = state.get("losses", [])
        log(f"train: resumed at step {step}/{planned}" + parallel.world_note(state.get("world", 1)))
    t_eval = time.time()
    if not history:
        history.append({"step": 0, **evaluate(drafter, held, cfg)})
        log(f"train: before training {_fmt(history[-1])}")
    t_eval = time.time() - t_eval  # what one evaluation costs: the time budget pays for them too
    per_epoch = max(1, len(train_seqs) // cfg.batch_seqs)
    drafter.train()
    t0, t_last_ckpt, t_last_log, tokens, step0 = time.time(), time.time(), 0.0, 0, step
    while planned is None or step < planned:
        epoch, k = divmod(step, per_epoch)
        order = _order(len(train_seqs), cfg.seed, epoch)[k * cfg.batch_seqs:(k + 1) * cfg.batch_seqs]
        # this rank's share of the step's global batch (all of it with one process)
        part = [train_seqs[i] for i in order[parallel.mine(len(order))] if train_seqs[i].prompt_len < cfg.max_len]
        batch = _batch(part, cfg.max_len) if part else None
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, planned or 1000)
        if parallel.world() == 1:
            with torch.autocast(next(drafter.parameters()).device.type, torch.bfloat16, enabled=cfg.bf16):
                loss = _kd_loss(_answer_logits(drafter, batch), batch, cfg.ce_weight)
            loss.backward()
            loss_value = loss.item()
        else:  # the rows' sum over the global batch's row count, gradients added over the ranks
            rows = int(parallel.total(torch.tensor(len(batch["b"]) if batch is not None else 0)))
            loss = torch.zeros(())
            if batch is not None:
                with torch.autocast(next(drafter.parameters()).device.type, torch.bfloat16, enabled=cfg.bf16):
                    loss = _kd_loss(_answer_logits(drafter, batch), batch, cfg.ce_weight, rows)
                loss.backward()
            loss_value = float(parallel.sum_grads(params, loss.detach().float().cpu()))
        losses.append(round(loss_value, 6))
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % TRIM_EVERY == 0:
            release_freed()
        tokens += len(batch["b"]) if batch is not None else 0
        elapsed = time.time() - t0
        rate = elapsed / (step - step0)  # seconds per step in this run
        done = step - step0
        if seconds is not None and cfg.steps is None and (done == 3 or (done > 3 and done % REPLAN_EVERY == 0)):
            # time budget: the schedule length follows from the steps so far, re-planned as they slow down
            left = seconds - spent - elapsed - 2 * t_eval  # the last periodic evaluation and the final one
            new = parallel.from_main(max(step + 1, step + int(left / (rate + t_eval / cfg.eval_every))))
            if planned is None or abs(new - planned) > 0.02 * planned:
                log(f"train: {rate:.1f} s/step -> {new} steps in {(seconds - spent) / 60:.1f} min")
            planned = new
        if step % cfg.eval_every == 0 or step == planned:
            history.append({"step": step, "loss": round(loss_value, 4), **evaluate(drafter, held, cfg)})
            log(f"train: step {step} {_fmt(history[-1])}")
        if planned and (time.time() - t_last_log > 10 or step == planned):
            t_last_log = time.time()
            bar = "#" * int(20 * step / planned)
            log(f"train {step}/{planned} [{bar:<20}] {tokens / elapsed:,.0f} answer tok/s, ETA "
                f"{rate * (planned - step) / 60:.1f} min, loss {loss_value:.3f}, held-out greedy agreement "
                f"{history[-1]['greedy_agreement']:.3f}")
        if parallel.is_main() and (time.time() - t_last_ckpt > cfg.checkpoint_seconds or step == planned):
            _save(ckpt_dir, {"model": trainable_state(drafter), "opt": opt.state_dict(), "step": step,
                             "planned": planned, "seconds": spent + elapsed, "history": history, "losses": losses,
                             "world": parallel.world()})
            t_last_ckpt = time.time()
    with torch.no_grad():  # measure what is saved: fp16 weights
        for p in params:
            p.copy_(p.half().float())
    final = evaluate(drafter, held, cfg)
    return {"config": asdict(cfg), "steps": step, "seconds": round(spent + time.time() - t0, 1),
            "processes": parallel.world(), "history": history, "losses": losses,
            "final": {k: round(v, 4) if isinstance(v, float) else v for k, v in final.items()}}


def _fmt(m: dict) -> str:
    return (f"held-out greedy agreement {m['greedy_agreement']:.3f}, T=0.7 acceptance {m['accept_t07']:.3f} "
            f"(+<= {m['accept_t07_p_tail']:.3f} tail), KD loss {m['kd_loss']:.3f}")
