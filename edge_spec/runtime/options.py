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
  the loop's overhead share (benchmarks/bench_runtime.py); on a phone it also saves power.
  Memory is unaffected, so export-time measurements stay valid. On an *idle* machine the opposite
  holds (spinning saves each kernel's thread wake-up: +5-7 % on the SmolLM2 split:4 target here,
  ~700 kernels per step), so ``spin=True`` (``Engine.load(spin=True)``, CLI ``--spin``) turns it on,
  as llama.cpp does by default; the price is busy-waiting cores between steps.
"""

from __future__ import annotations

import onnxruntime as ort


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
    return so
