"""Data-parallel ``edge-spec distill`` under ``torchrun``: the process group and the few collectives it needs.

``torchrun --nproc_per_node N -m edge_spec distill ...`` (or its multi-machine form) starts N processes with
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` in their environment; :func:`start`
joins them into one group (gloo on CPUs, NCCL on CUDA GPUs, each rank on GPU ``LOCAL_RANK``). Without those
variables (a plain ``edge-spec distill``) every function here is the one-process identity and nothing is started.

What a rank does with it (the callers, not this module, decide):
* **data**: generation jobs, the feature pass and the teacher pass are split by job / sequence among the ranks
  (:func:`mine`); what one rank computed reaches the others through the shared ``--out`` directory or
  :func:`gather`;
* **training**: every step's global batch (a function of seed and step only, as on one process) is split among the
  ranks; each rank's loss is its rows' sum over the *global* row count (:func:`total`), and :func:`sum_grads` adds
  the ranks' gradients, so a step is the one-process step up to float reduction order, whatever the world size;
* **output**: rank 0 alone logs, writes checkpoints and the drafter (:func:`is_main`); every rank reads a resumed
  checkpoint through rank 0 (:func:`from_main`).
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from edge_spec.errors import EdgeSpecError

T = TypeVar("T")
# Ranks wait for one another at stage ends (a rank's share of generation or of the feature pass may finish hours
# before another's); torchrun stops every rank when one fails, so a long wait is no hang.
TIMEOUT = datetime.timedelta(hours=48)

_device = torch.device("cpu")  # where collectives' tensors live: the GPU of this rank under NCCL


def launched() -> bool:
    """Whether this process was started by ``torchrun`` with more than one process in the job."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: str) -> torch.device:
    """Join the job's process group when ``torchrun`` started this process; returns the device this rank computes on
    (``cuda:LOCAL_RANK`` under CUDA). A no-op (``device`` itself) without ``torchrun``; joined once per process (a
    second run in the same process keeps the group: a group left and joined again waits forever) and left at exit."""
    global _device
    if not launched():
        return torch.device(device)
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise EdgeSpecError(f"WORLD_SIZE is set but {', '.join(missing)} is not; start distill with torchrun (e.g. "
                            "torchrun --nproc_per_node 2 -m edge_spec distill ...) or unset WORLD_SIZE.")
    if device == "cuda":
        _device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(_device)
    else:
        _device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=TIMEOUT)
        atexit.register(stop)
    return _device


def stop() -> None:
    """Leave the process group, if one was joined (at exit: after the process's last collective)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    """This process's rank in the job (0 without ``torchrun``)."""
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    """How many processes train together (1 without ``torchrun``)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Whether this rank writes (logs, checkpoints, the drafter): rank 0."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank gets here (e.g. a stage's files are all written)."""
    if world() > 1:
        dist.barrier()


def mine(n: int) -> np.ndarray:
    """[~n / world] the indices 0..n-1 this rank takes: every world-th, from its rank on."""
    return np.arange(rank(), n, world())


def total(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over the ranks (a new tensor on ``x``'s device; ``x`` itself with one process)."""
    if world() == 1:
        return x
    y = x.detach().to(_device, copy=True)
    dist.all_reduce(y)
    return y.to(x.device)


def sum_grads(params: list[torch.nn.Parameter], extra: torch.Tensor) -> torch.Tensor:
    """Add every rank's gradients of ``params`` in place (a missing gradient counts as zeros) in one all-reduce,
    together with ``extra`` (a float tensor, e.g. the step's loss); returns ``extra`` summed over the ranks."""
    if world() == 1:
        return extra
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(_device, torch.float32)
                      for p in params] + [extra.detach().reshape(-1).to(_device, torch.float32)])
    dist.all_reduce(flat)
    at = 0
    for p in params:
        n = p.numel()
        p.grad = flat[at:at + n].view_as(p).to(p.device, p.dtype)
        at += n
    return flat[at:].view_as(extra).to(extra.device, extra.dtype)


def same_params(module: torch.nn.Module) -> None:
    """Copy rank 0's trained parameters to every rank (they start equal by construction; this makes sure). Frozen
    ones (the target's embedding and LM head) are the target's on every rank."""
    if world() == 1:
        return
    with torch.no_grad():
        for p in (p for p in module.parameters() if p.requires_grad):
            buf = p.detach().to(_device, copy=True)
            dist.broadcast(buf, 0)
            p.copy_(buf.to(p.device))


def from_main(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (a decision that must be one: a step count, a checkpoint read once)."""
    if world() == 1:
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, 0, device=_device if _device.type == "cuda" else None)
    return box[0]


def gather(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out: list = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def world_note(saved: int) -> str:
    """What a resumed run says when its checkpoint was written by another number of processes (it continues: the
    global batch and its order depend on seed and step only)."""
    if saved == world():
        return ""
    return (f" (checkpoint of {saved} process{'es' if saved > 1 else ''}, now {world()}: the same global batches, "
            "only float reduction order changes)")


def agree(value: object, what: str) -> None:
    """Refuse, in one sentence, a run whose ranks disagree on ``value`` (e.g. the data they loaded)."""
    if world() == 1:
        return
    mine_ = pickle.dumps(value)
    if len({v for v in gather(mine_)}) > 1:
        raise EdgeSpecError(f"The {world()} processes of this distill job see different {what}; give every machine "
                            "the same --out directory (a shared filesystem) and the same files.")
