"""Training text written by the target, with the target's top-k logits at every generated position.

Generation is batched (left-padded, KV cache) because on a CPU one step for 64 rows costs little more
than one step for 1 row: decode is bound by reading the weights. Each decoding step's logits are the
teacher's distribution p for that position, so its top-k and logsumexp are kept for free: knowledge
distillation targets without a second pass.

The work is a deterministic list of *jobs* (one batch of prompts each), written one shard per job:

* ``si_NNNNN.npz``  self-instruct: the target writes new questions (they join the prompt pool);
* ``mq_NNNNN.json`` Magpie (Xu et al., 2024): the target is given its chat template up to where a user's
  message begins and writes the message itself — chat-like requests in the target's own distribution (they
  join the pool; the user-turn text is not training text, the drafter drafts answers);
* ``gen_NNNNN.npz`` answers to pool prompts at T = 0 / 0.7 / 1.0 in turn; every 4th job instead asks
  a follow-up question on the conversations of the job before it (multi-turn text).

A shard is written atomically, so an interrupted run resumes at the first missing shard and produces
the same shards as an uninterrupted one (each job seeds its own generator). The shard arrays are
``sequence.py``'s. Under ``torchrun`` the jobs are dealt out among the ranks (self-instruct, Magpie and evaluation
jobs one each in turn, answer jobs in blocks of four, so a follow-up stays with the job it follows); each job's
shard is the one a single process writes, and every rank then reads them all.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from edge_spec.distill import parallel
from edge_spec.distill import prompts as P
from edge_spec.distill.memory import release_freed
from edge_spec.distill.sequence import EVAL_TEMPERATURE, write_shard
from edge_spec.distill.target import Target, aux_hooks, bf16_body, render

if TYPE_CHECKING:
    from edge_spec.distill.features import FeatureWriter

TEMPERATURES = (0.0, 0.7, 1.0)


@dataclass(frozen=True)
class DataConfig:
    """What to generate. ``max_jobs`` caps the job count (exact, reproducible); the time budget may stop earlier."""

    seed: int = 0
    batch: int = 64
    max_new_tokens: int = 128
    max_prompt_tokens: int = 384
    top_k: int = 32
    heldout_percent: int = 5
    self_instruct: int = 96  # self-instruct requests (0: none)
    self_instruct_tokens: int = 40
    magpie: int = 256  # user messages the target writes from its template's user prefix (0: none)
    magpie_tokens: int = 64
    max_jobs: int | None = None
    extra_prompts: tuple[str, ...] = ()
    eval_prompts: int = 48  # held-out prompts answered at T=0 and at T=0.7 for the evaluation shards
    bf16: bool = False  # the target's matmuls under bfloat16 autocast while it writes (run.train_precision)


@torch.no_grad()
def generate(model: torch.nn.Module, prompts: list[list[int]], temperature: float, max_new: int,
             stop_ids: tuple[int, ...], top_k: int, seed: int, pad_id: int,
             bf16: bool = False, aux: tuple[int, ...] | None = None) -> list[dict[str, np.ndarray]]:
    """Continue each prompt; return per sequence its answer ids [L] and teacher top-k / logsumexp [L, ...].

    The answer ends with (and includes) the first stop token, or after ``max_new`` tokens. ``bf16``: the
    decoder's matmuls in bfloat16 (``target.bf16_body``). ``aux``: also return ``features`` float16 [P + L, n_aux *
    hidden], the residual streams entering those layers (``target.aux_hooks``) at every prompt and answer
    position, as the writing computed them — an EAGLE-3 run then needs no feature pass over this text."""
    store: dict[int, torch.Tensor] = {}
    handles = aux_hooks(model, aux, store) if aux else []
    try:
        with bf16_body(model, bf16):
            return _generate(model, prompts, temperature, max_new, stop_ids, top_k, seed, pad_id,
                             (aux, store) if aux else None)
    finally:
        for h in handles:
            h.remove()


def _generate(model: torch.nn.Module, prompts: list[list[int]], temperature: float, max_new: int,
              stop_ids: tuple[int, ...], top_k: int, seed: int, pad_id: int,
              capture: tuple[tuple[int, ...], dict[int, torch.Tensor]] | None) -> list[dict[str, np.ndarray]]:
    device = next(model.parameters()).device

    def features() -> np.ndarray:  # [B, S, n_aux * H] float16 of the pass just run (numpy: autocast stacks no fp16)
        aux, store = capture
        return np.concatenate([store[j].float().cpu().numpy() for j in aux], -1).astype(np.float16)
    gen = torch.Generator(device=device).manual_seed(seed)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    prefill = features() if capture else None
    fed: list[np.ndarray] = []  # features of each answer token once it is fed back [B, n_aux * H]
    stops = torch.tensor(stop_ids, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    steps: list[tuple[torch.Tensor, ...]] = []
    for _ in range(max_new):
        logits = out.logits[:, -1].float()  # [B, V]
        lse = torch.stack([logits.logsumexp(-1), (logits / EVAL_TEMPERATURE).logsumexp(-1)], -1)  # [B, 2]
        top_v, top_i = logits.topk(top_k, -1)  # [B, k]
        if temperature == 0.0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
        steps.append((nxt, top_i, top_v, lse, done.clone()))
        done |= torch.isin(nxt, stops)
        finished = bool(done.all())
        if finished and not capture:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                    past_key_values=out.past_key_values, use_cache=True)
        if capture:
            fed.append(features()[:, -1])
            if finished:  # the last answer tokens were fed for their features: stop here
                break
    nxt, top_i, top_v, lse, was_done = (torch.stack(t, 1).cpu() for t in zip(*steps))  # [B, steps, ...]
    answer_feats = np.stack(fed, 1) if capture else None  # [B, steps, n_aux * H]
    results = []
    for b in range(len(prompts)):
        n = int((~was_done[b]).sum())  # positions generated before this row stopped
        results.append({"answer": nxt[b, :n].numpy().astype(np.int32),
                        "topk_ids": top_i[b, :n].numpy().astype(np.int32),
                        "topk_logits": top_v[b, :n].numpy().astype(np.float16),
                        "lse": lse[b, :n].numpy().astype(np.float32)})
        if capture:
            results[-1]["features"] = np.concatenate([prefill[b, width - len(prompts[b]):], answer_feats[b, :n]])
    return results


def _pad_id(target: Target) -> int:
    """The id generation pads prompts with: the tokenizer's pad token, else the first stop token."""
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else target.stop_ids[0]


def _run_job(target: Target, cfg: DataConfig, path: Path, convs: list[dict], temp: float, max_new: int,
             seed: int, features: FeatureWriter | None = None) -> float:
    """Generate one shard for ``convs`` (each {"messages": [...], "heldout": bool}); return seconds spent.

    ``features``: also keep the target's aux features of the text, as computed while writing it (a feature
    segment, written before the shard: a shard never lacks its segment for lack of time)."""
    t0 = time.time()
    tok = target.tokenizer
    keep = []
    for c in convs:
        ids = render(tok, c["messages"])
        if len(ids) <= cfg.max_prompt_tokens:
            keep.append((c, ids))
    results = generate(target.model, [ids for _, ids in keep], temp, max_new, target.stop_ids, cfg.top_k, seed,
                       _pad_id(target), cfg.bf16, features.aux if features else None)
    if features is not None:
        features.write([(np.concatenate([np.asarray(ids, np.int32), r["answer"]]), len(ids))
                        for (_, ids), r in zip(keep, results)], [r.pop("features") for r in results])
    out_convs = []
    for (c, _), r in zip(keep, results):
        text = tok.decode(r["answer"].tolist(), skip_special_tokens=True)
        out_convs.append({"messages": c["messages"], "answer": text, "heldout": c["heldout"]})
    release_freed()  # the batch's KV cache, grown by concatenation, leaves a fragmented heap
    seconds = time.time() - t0
    write_shard(path, [ids for _, ids in keep], results, temp, [c["heldout"] for c, _ in keep], out_convs, seconds,
                 "bf16" if cfg.bf16 else "fp32")
    return seconds


def magpie_prefix(tok) -> list[int] | None:
    """Token ids of the chat template rendered up to where the first user message's text begins (the default
    system prompt included, as ``Engine.chat`` renders it), or None when the template puts no text there."""
    mark = "\u2063edge-spec\u2063"
    try:
        text = tok.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                       add_generation_prompt=False)
    except Exception:  # a template that needs more than one user message
        return None
    if not isinstance(text, str) or mark not in text:
        return None
    ids = tok(text[:text.index(mark)], add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids] or None


def magpie_prompts(tok, answers: list[np.ndarray], stop_ids: tuple[int, ...]) -> list[str]:
    """The usable user messages among sampled ones (each [n] ids): those that ended their turn with a stop token
    and read as a request (12-400 characters), without repeats, in order."""
    out = []
    for a in answers:
        if len(a) and int(a[-1]) in stop_ids:
            q = tok.decode(a[:-1].tolist(), skip_special_tokens=True).strip()
            if 12 <= len(q) <= 400:
                out.append(q)
    return list(dict.fromkeys(out))


def _magpie_job(target: Target, prefix: list[int], n: int, cfg: DataConfig, path: Path, seed: int) -> float:
    """``n`` user messages sampled (T = 1) after ``prefix``; the ones that end their turn within
    ``cfg.magpie_tokens`` tokens and read as a request (12-400 characters) go to ``path``. Returns seconds."""
    t0 = time.time()
    results = generate(target.model, [prefix] * n, 1.0, cfg.magpie_tokens, target.stop_ids, 1, seed, _pad_id(target),
                       cfg.bf16)
    out = magpie_prompts(target.tokenizer, [r["answer"] for r in results], target.stop_ids)
    seconds = time.time() - t0
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"prompts": out, "asked": n, "seconds": round(seconds, 2)}) + "\n")
    os.replace(tmp, path)
    return seconds


def _user(text: str, cfg: DataConfig) -> dict:
    return {"messages": [{"role": "user", "content": text}], "heldout": P.is_heldout(text, cfg.heldout_percent)}


def shard_seconds(data_dir: Path) -> float:
    """Generation seconds already spent on the shards in ``data_dir`` (a resumed run counts them)."""
    return sum(json.loads(p.read_text()).get("seconds", 0.0) for p in data_dir.glob("*.json")
               if p.name != "done.json")


def generate_data(target: Target, cfg: DataConfig, data_dir: Path, seconds: float | None,
                  log: Callable[[str], None] = print, features: FeatureWriter | None = None) -> list[Path]:
    """Write shards into ``data_dir`` until ``cfg.max_jobs`` or ``seconds`` (wall clock, counting earlier runs).

    Returns the shard paths in job order. A ``done.json`` marks the data as final. ``features``: keep the aux
    features of every training text as it is written (:func:`_run_job`). Under ``torchrun`` each rank runs its jobs
    (module docstring) on its share of the budget: the seconds spent so far over the ranks, per rank."""
    data_dir.mkdir(parents=True, exist_ok=True)
    done_file = data_dir / "done.json"
    if done_file.exists():
        return [data_dir / n for n in json.loads(done_file.read_text())["shards"]]
    world, rank = parallel.world(), parallel.rank()
    spent = shard_seconds(data_dir) / world
    shards: list[Path] = []
    last = [0.0]  # seconds of the last job run here: a job that would overrun the budget is not started
    of = f" of {seconds:.0f}s budget" if seconds is not None else ""

    def over_time() -> bool:
        return seconds is not None and spent + 0.8 * last[0] >= seconds

    def out_of_budget(jobs_before: int) -> bool:
        return (cfg.max_jobs is not None and jobs_before >= cfg.max_jobs) or over_time()

    # 1. self-instruct: the target writes new prompts.
    requests = P.self_instruct_requests()
    random.Random(cfg.seed).shuffle(requests)
    requests = requests[: cfg.self_instruct]
    for j, i in enumerate(range(0, len(requests), cfg.batch)):
        if j % world != rank:
            continue
        path = data_dir / f"si_{j:05d}.npz"
        if not path.exists():
            if out_of_budget(j):
                break
            last[0] = _run_job(target, cfg, path, [_user(r, cfg) for r in requests[i:i + cfg.batch]], 1.0,
                               cfg.self_instruct_tokens, cfg.seed * 1000003 + 7919 * j + 1, features)
            spent += last[0]
            log(f"data: {path.name} written ({spent:.0f}s{of} of generation so far)")
        shards.append(path)
    # 2. Magpie: the target writes user messages (prompts only: not shards, not counted in max_jobs).
    prefix = magpie_prefix(target.tokenizer) if cfg.magpie > 0 else None
    if cfg.magpie > 0 and prefix is None:
        log("data: the chat template has no user turn to start from; no Magpie prompts")
    for j, i in enumerate(range(0, cfg.magpie if prefix is not None else 0, cfg.batch)):
        if j % world != rank:
            continue
        path = data_dir / f"mq_{j:05d}.json"
        if not path.exists():
            if over_time():
                break
            last[0] = _magpie_job(target, prefix, min(cfg.batch, cfg.magpie - i), cfg, path,
                                  cfg.seed * 1000003 + 7919 * j + 3)
            spent += last[0]
            log(f"data: {path.name} written ({spent:.0f}s{of} of generation so far)")
    # 3. the pool: built-in + user + self-instruct + Magpie prompts, one deterministic order.
    parallel.barrier()  # every rank's self-instruct and Magpie files are written
    n_si = sum(parallel.gather(len(shards)))
    pool = _pool(cfg, data_dir)
    cursor, j = 0, 0
    while cursor < len(pool) and (cfg.max_jobs is None or n_si + j < cfg.max_jobs):
        path = data_dir / f"gen_{j:05d}.npz"
        mine = (j // 4) % world == rank  # blocks of four: a follow-up job stays with the job it follows
        if mine and not path.exists() and over_time():  # shards already written count, whatever this run's budget
            break
        temp = TEMPERATURES[j % len(TEMPERATURES)]
        if not mine:
            cursor += 0 if j % 4 == 3 else cfg.batch
        elif j % 4 == 3:  # multi-turn: a follow-up on the previous job's conversations
            prev = json.loads((data_dir / f"gen_{j - 1:05d}.json").read_text())["conversations"]
            rng = random.Random(cfg.seed * 31 + j)
            convs = [{"messages": c["messages"] + [{"role": "assistant", "content": c["answer"].strip()},
                                                   {"role": "user", "content": rng.choice(P.FOLLOW_UPS)}],
                      "heldout": c["heldout"]} for c in prev if c["answer"].strip()]
        else:
            convs = [_user(t, cfg) for t in pool[cursor:cursor + cfg.batch]]
            cursor += cfg.batch
        if mine and not path.exists():
            last[0] = _run_job(target, cfg, path, convs, temp, cfg.max_new_tokens, cfg.seed * 1000003 + 7919 * j + 2,
                               features)
            spent += last[0]
            log(f"data: {path.name} (T={temp}, {len(convs)} prompts, {last[0] / max(len(convs), 1):.1f}s/answer) "
                f"written ({spent:.0f}s{of} of generation so far)")
        if mine:
            shards.append(path)
        j += 1
    if world > 1:  # every rank's shards, in job order (self-instruct first), as one process lists them
        parallel.barrier()
        names = sorted({p.name for part in parallel.gather(shards) for p in part}, key=lambda n: (n[:3] != "si_", n))
        shards = [data_dir / n for n in names]
        spent = shard_seconds(data_dir)
    if parallel.is_main():
        done_file.write_text(json.dumps({"shards": [p.name for p in shards], "seconds": round(spent, 1)}) + "\n")
    return shards


def _pool(cfg: DataConfig, data_dir: Path) -> list[str]:
    """The prompt pool in its deterministic order (needs the self-instruct shards already written)."""
    new_prompts: list[str] = []
    for path in sorted(data_dir.glob("si_*.json")):
        for conv in json.loads(path.read_text())["conversations"]:
            q = P.clean_self_instruct(conv["answer"])
            if q:
                new_prompts.append(q)
    for path in sorted(data_dir.glob("mq_*.json")):
        new_prompts += json.loads(path.read_text())["prompts"]
    pool = list(dict.fromkeys(P.builtin_prompts() + list(cfg.extra_prompts) +
                              [q for q in new_prompts if q not in P.HELD_APART]))
    random.Random(cfg.seed + 1).shuffle(pool)
    return pool


def generate_eval(target: Target, cfg: DataConfig, data_dir: Path, log: Callable[[str], None] = print,
                  features: FeatureWriter | None = None) -> list[Path]:
    """Evaluation shards: ``cfg.eval_prompts`` held-out prompts answered at T=0 and at T=0.7.

    Taken from the END of the pool, which the training jobs (reading from its start) have not reached, so
    the held-out measurement does not hang on the few held-out prompts a short run happens to meet."""
    if cfg.eval_prompts <= 0:
        return []
    held = [t for t in reversed(_pool(cfg, data_dir)) if P.is_heldout(t, cfg.heldout_percent)][: cfg.eval_prompts]
    paths = []
    for j, temp in enumerate((0.0, EVAL_TEMPERATURE)):
        path = data_dir / f"eval_{j:05d}.npz"
        if j % parallel.world() == parallel.rank() and not path.exists():
            convs = [{"messages": [{"role": "user", "content": t}], "heldout": True} for t in held]
            sec = _run_job(target, cfg, path, convs, temp, cfg.max_new_tokens, cfg.seed * 1000003 + 7919 * j + 3,
                           features)
            log(f"data: {path.name} (T={temp}, {len(convs)} held-out prompts) written in {sec:.0f}s")
        paths.append(path)
    parallel.barrier()  # each rank wrote its evaluation jobs
    return paths
