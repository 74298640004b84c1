"""ONNX Runtime session options shared by the runtime and by the export-time measurements.

The memory planner relies on numbers measured at export (session load bytes, per-pass
workspace). Those numbers only hold if the runtime creates its sessions the same way, so
both sides build options here.

Why these settings:
* ``enable_cpu_mem_arena = False`` - the CPU arena grows in chunks and never returns
  memory, so peak RSS would depend on history; without it every pass allocates and frees
  exactly what it needs, and the measured workspace is what the planner reserves.
* ``enable_mem_pattern = False`` - memory patterns preallocate one block per input shape
  seen; with varying k (draft length) they would accumulate.
* ``session.intra_op.allow_spinning = 0`` - by default idle pool threads spin after each run,
  competing with the Python thread that samples and drafts between runs. On the project's busy
  2-core machine turning spinning off made the demo target's decode 1.8-2.5x faster and halved
  the loop's overhead share (benchmarks/probes/bench_runtime.py); on a phone it also saves power.
  Memory is unaffected, so export-time measurements stay valid. On an *idle* machine the opposite
  holds (spinning saves each kernel's thread wake-up: +5-7 % on the SmolLM2 split:4 target here,
  ~700 kernels per step), so ``spin=True`` (``Engine.load(spin=True)``, CLI ``--spin``) turns it on,
  as llama.cpp does by default; the price is busy-waiting cores between steps.

Threads (``thread_plan``, measured 2026-11-24 on the idle 2-core machine, SmolLM2 demo bundle, 6 chat prompts x
96 tokens, one process, configurations interleaved): a second thread *without* spinning bought the target
nothing (AR 92.7 vs 92.9 tok/s at 1 thread: ~850 kernels a step, each waking the other thread); *with*
spinning 121.6 (1.31x). The drafter's passes are too small to split, and its pool's spinning threads take the
core from the target's: target 2 threads + spin with the drafter on 1 thread gave speculative 146.4 tok/s,
both on 2 spinning threads 134.7, both on 2 threads without spinning (the old default) 118.3. So by default the
target takes every core and spins when it has more than one thread, and the drafter runs on one thread (a
one-thread session has no pool, so nothing spins). ``spin=False`` / ``--no-spin`` is for machines where other
work shares the cores.
"""

from __future__ import annotations

import os

import onnxruntime as ort

from edge_spec import kernels


def session_options(threads: int = 0, spin: bool = False) -> ort.SessionOptions:
    """Options for one decoder session; ``threads=0`` lets ORT use all physical cores; ``spin`` lets idle pool
    threads busy-wait between kernels (faster on an idle machine, slower on a busy one)."""
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = False
    so.enable_mem_pattern = False
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if kernels.available():  # edge-spec's K-quant ops, for graphs that use them (edge_spec/kernels.py)
        kernels.register(so, [kernels.KQUANT])
    return so


def thread_plan(threads: int = 0, spin: bool | None = None, drafter_threads: int | None = None
                ) -> tuple[tuple[int, bool], tuple[int, bool]]:
    """((target threads, spin), (drafter threads, spin)) for ``Engine.load``'s options (see "Threads" above)."""
    cores = os.cpu_count() or 1
    t_threads = threads or cores  # what ORT's 0 gives, near enough to decide whether there is a pool at all
    d_threads = 1 if drafter_threads is None else drafter_threads
    t_spin = (t_threads > 1) if spin is None else spin
    d_spin = False if spin is None else spin
    return (threads, t_spin), (d_threads, d_spin and (d_threads or cores) > 1)
