"""Keep a long ``distill`` run's resident memory near what it actually holds.

Two things made a 12-minute run on SmolLM2 grow to 6.5 GB resident (and, by the same growth, an hour's to 14 GB)
while it held a few GB of live tensors (measured with /proc/PID/status, BENCHMARKS.md "Distill's memory"):

* oneDNN, which runs torch's bfloat16 matmuls on CPU, keeps a compiled *primitive* (with its reordered weights
  and scratch space) for every matmul shape it has seen, up to 1,024 of them. Training batches pad to their
  longest sequence, so nearly every step brings new shapes. :func:`cap_primitive_cache` keeps a few.
* glibc keeps the memory of freed mid-sized tensors (below its mmap threshold) in its heaps, fragmented by
  tensors of ever-changing sizes; :func:`release_freed` hands the free pages back to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

TRIM_EVERY = 10  # training steps between two release_freed() calls (a trim costs a few ms)
PRIMITIVE_CACHE = 16  # shapes oneDNN keeps compiled: a step's few matmuls hit it, a new batch shape recompiles


def cap_primitive_cache(capacity: int = PRIMITIVE_CACHE) -> None:
    """Bound oneDNN's primitive cache unless the user set ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` themselves.

    oneDNN reads the variable when it creates its first primitive, so call this before the first bf16 matmul."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))


def _libc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _libc_trim()


def release_freed() -> bool:
    """Return the heap's free pages to the system (glibc ``malloc_trim(0)``); False where there is no glibc."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
