"""Resident memory of this process: its RSS without psutil (the lean runtime does not depend on it), and letting
the pages of mapped weight files go (after load; a row table's after every pass)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def current_rss() -> int:
    """Bytes resident now (Linux: /proc; elsewhere psutil if present, else the peak so far)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return peak_rss()


def settled_rss() -> int:
    """Bytes resident once freed memory is given back: :func:`current_rss` after a garbage collection and, with
    glibc, ``malloc_trim(0)`` (loading a tokenizer frees ~40 MiB of parsing buffers that glibc keeps until trimmed;
    counted in a plan's baseline they were never resident beside the weights). Elsewhere :func:`current_rss`
    after the collection."""
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim by this name
            pass
    return current_rss()


def peak_rss() -> int:
    """Peak resident bytes of this process so far.

    Linux: VmHWM of the current address space. ``ru_maxrss`` survives ``exec``, so in a child
    started by a large parent (fork, then exec) it reports the parent's size; VmHWM does not.
    Elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows without psutil: no peak counter
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def drop_mapped_pages(root: str | os.PathLike[str]) -> int:
    """Let the kernel drop the resident pages of this process's mappings of files under ``root`` that hold only
    clean file pages; return the size of the mappings advised in bytes (0 where this is not Linux).

    Why: ONNX Runtime maps a graph's external weights (``model.onnx.data``) tensor by tensor and reads them at
    session creation to repack them into its own layout (MatMulNBits, and MLAS's packed fp32 GEMM weights); the
    runtime maps the shared embedding itself. After that, only a few small tensors (norm weights) and the
    embedding rows of the tokens seen are read again, but every page read at load stays resident: ~45 MiB for
    the SmolLM2 demo target. Dropping clean pages loses nothing: a later read faults them back in from the file
    (page cache); MADV_RANDOM stops read-ahead from the file (not the kernel's fault-around of pages already
    cached: FAULT_AROUND_BYTES). A mapping with a modified
    (copy-on-write) page is left alone. Call it once the sessions have run a pass (lazily packed kernels
    included)."""
    import mmap

    base = os.path.realpath(root) + os.sep
    madvise, ranges = _clean_mappings(lambda path: path.startswith(base))
    dropped = 0
    for lo, hi in ranges:
        if madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0:
            madvise(lo, hi - lo, mmap.MADV_RANDOM)
            dropped += hi - lo
    return dropped


# Pages one read of a table row can make resident: the kernel maps up to 16 pages already in the page cache around a
# faulting one (fault_around_bytes, 64 KiB by default; MADV_RANDOM does not turn it off), plus the row's own span.
FAULT_AROUND_BYTES = 64 << 10
RELEASES_ROW_TABLES = sys.platform.startswith("linux")  # RowTables.release works here (madvise); elsewhere a no-op


class RowTables:
    """The mappings of a bundle's row-read tables (``ModelSpec.row_tables``: an untied embedding), let go after
    every pass: :meth:`release` tells the kernel to drop their resident pages (clean file pages: a later read
    faults them back from the page cache), so only the rows of one pass stay resident, not a page per token ever
    seen. ~20 us a call on a 131 MB mapping (2-core EPYC, 2026-12-02). Linux only; elsewhere nothing."""

    def __init__(self, files: list[str | os.PathLike[str]]) -> None:
        self.ranges: list[tuple[int, int]] = []
        self._madvise: Any = None
        if RELEASES_ROW_TABLES and files:
            import mmap

            want = {os.path.realpath(f) for f in files}
            self._madvise, self.ranges = _clean_mappings(want.__contains__)
            self._dontneed = mmap.MADV_DONTNEED

    def release(self) -> None:
        for lo, hi in self.ranges:
            self._madvise(lo, hi - lo, self._dontneed)


def _clean_mappings(accept: Callable[[str], bool]) -> tuple[Any, list[tuple[int, int]]]:
    """(libc's madvise, [(start, end)]) of this process's file mappings whose path ``accept`` takes and that hold
    only clean file pages: ONNX Runtime maps external data private and writable (rw-p), and a page it had modified
    (copy-on-write: "Anonymous") would be lost by dropping it. (None, []) where this is not Linux or /proc cannot
    be read."""
    if not sys.platform.startswith("linux"):
        return None, []
    import ctypes

    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None, []
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise, [(lo, hi) for lo, hi, perms, path, anonymous in _file_mappings(text)
                     if accept(path) and perms.startswith("r") and not anonymous]


def _file_mappings(smaps: str) -> list[list]:
    """[start, end, perms, path, anonymous kB] of each file mapping in a /proc/self/smaps text."""
    out: list[list] = []
    cur: list | None = None
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" in head[3] and not head[0].endswith(":"):  # a mapping's header
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            cur = [lo, hi, head[1], head[5] if len(head) > 5 else "", 0]
            if cur[3].startswith("/"):
                out.append(cur)
        elif cur is not None and line.startswith("Anonymous:"):
            cur[4] = int(line.split()[1])
    return out
