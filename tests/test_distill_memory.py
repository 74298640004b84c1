"""distill/memory.py: the heap's free pages go back to the system; oneDNN's primitive cache is bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edge_spec.distill import memory

ROOT = Path(__file__).resolve().parents[1]
_ANON = textwrap.dedent("""
    def anon():  # resident anonymous memory of this process, KiB
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
""")


def _run(code: str, *args: str) -> list[str]:
    """``code`` in a fresh interpreter started in the repository (so it imports this checkout); its stdout words."""
    return subprocess.run([sys.executable, "-c", _ANON + code, *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


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
        blocks = []
        for _ in range(4000):
            p = libc.malloc(64 * 1024); ctypes.memset(p, 1, 64 * 1024); blocks.append(p)
        for p in blocks[:-1]:
            libc.free(p)
        before = anon(); assert release_freed(); after = anon()
        print(before, after)
    """)
    before, after = (int(w) for w in _run(code))
    assert before - after > 200_000, (before, after)  # of the ~256 MB freed, most goes back (KiB)


_SHAPES = textwrap.dedent("""
    import os
    import sys
    import torch
    from edge_spec.distill.memory import cap_primitive_cache
    if sys.argv[1] == "capped":
        os.environ.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
        cap_primitive_cache()
    else:
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "1024"  # oneDNN's default
    torch.set_num_threads(1)
    lin = torch.nn.Linear(576, 2048)
    before = anon()
    for m in range(1000, 1200, 2):
        x = torch.randn(m, 576, requires_grad=True)
        with torch.autocast("cpu", torch.bfloat16):
            y = lin(x).float().sum()
        y.backward()
    print((anon() - before) // 1024)  # MiB
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_capped_primitive_cache_keeps_bf16_matmuls_of_many_shapes_from_growing_memory() -> None:
    # torch imported first, as in `edge-spec distill` (oneDNN reads the variable at its first primitive); 100 batch
    # shapes through a bf16 576 -> 2048 linear and its backward: resident memory grew ~520 MB here with oneDNN's
    # default cache (a compiled primitive with its reordered weights per shape), ~180 MB capped.
    pytest.importorskip("torch")
    from edge_spec.distill.run import cpu_has_bf16

    if not cpu_has_bf16():  # distill then trains in float32; oneDNN's emulated bf16 grew 50 MB either way (AVX2 EPYC)
        pytest.skip("this CPU has no native bfloat16 matmuls, the only path whose primitive cache grows")
    grown = {mode: int(_run(_SHAPES, mode)[-1]) for mode in ("capped", "default")}
    assert grown["capped"] < 0.5 * grown["default"], grown
