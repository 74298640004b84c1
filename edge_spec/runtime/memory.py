"""Resident-set size of this process, without psutil (the lean runtime does not depend on it)."""

from __future__ import annotations

import os
import sys


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
