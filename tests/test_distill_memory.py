"""distill/memory.py: the heap's free pages go back to the system; oneDNN's primitive cache is bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edge_spec.distill import memory


def test_cap_primitive_cache_keeps_a_users_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    memory.cap_primitive_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(memory.PRIMITIVE_CACHE)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    memory.cap_primitive_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._TRIM is None, reason="needs glibc")
def test_release_freed_returns_a_fragmented_heaps_free_pages() -> None:
    # A fresh process: 4,000 blocks of 64 KiB (below glibc's mmap threshold, so on the heap), all freed but the
    # last, which pins the heap's top so it cannot shrink by itself. Resident memory stays up until the trim.
    code = textwrap.dedent("""
        import ctypes
        from edge_spec.distill.memory import release_freed
        libc = ctypes.CDLL("libc.so.6"); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]
        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
        blocks = []
        for _ in range(4000):
            p = libc.malloc(64 * 1024); ctypes.memset(p, 1, 64 * 1024); blocks.append(p)
        for p in blocks[:-1]:
            libc.free(p)
        before = anon(); assert release_freed(); after = anon()
        print(before, after)
    """)
    root = str(Path(memory.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env).stdout.split()
    before, after = int(out[0]), int(out[1])
    assert before - after > 200_000, (before, after)  # of the ~256 MB freed, most goes back (KiB)
