"""edge-spec's own ONNX Runtime kernels: finding the compiled library and registering it with a session.

The K-quant library (``kernels/kquant/``, built by pip into ``edge_spec/_kquant*.so`` when a C++
compiler is at hand on x86-64) adds the custom ops ``edge_spec::GgufMatMul`` (``y = x @ W^T`` straight from a
GGUF's Q4_K / Q6_K super-blocks, or Q8_0 / Q5_0 / Q4_1 blocks of 32) and ``edge_spec::GgufGather`` (embedding rows from
the K-quants). A graph that uses them
says so in its manifest (``ModelSpec.custom_ops``); graphs without them never need the library.
``EDGE_SPEC_KQUANT_LIB`` points at another build of it (a path, or ``none`` to act as if it were absent).
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

import onnxruntime as ort

KQUANT = "edge_spec.kquant"  # the name a manifest's custom_ops gives the library
_ENV = "EDGE_SPEC_KQUANT_LIB"
_CPU_FLAGS = ("avx2", "fma", "f16c")


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux), None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@cache
def kquant_library() -> tuple[Path | None, str]:
    """(path of the K-quant op library, "") when it can run here, else (None, one sentence saying why)."""
    env = os.environ.get(_ENV, "").strip()
    if env.lower() == "none":
        return None, f"{_ENV}=none turns it off"
    if env:
        p = Path(env).expanduser()
        return (p, "") if p.is_file() else (None, f"{_ENV} names '{p}', which is not a file")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"it is built for x86-64 CPUs only, and this one is {platform.machine()}"
    found = sorted(Path(__file__).parent.glob("_kquant*.so"))
    if not found:
        return None, ("it was not built when edge-spec was installed (no C++ compiler then?); install g++ and "
                      "reinstall edge-spec")
    flags = _cpu_flags()
    if flags is None:
        return None, "this system does not say whether the CPU has AVX2, FMA and F16C (no /proc/cpuinfo)"
    missing = [f for f in _CPU_FLAGS if f not in flags]
    if missing:
        return None, f"this CPU lacks {', '.join(missing).upper()}"
    return found[0], ""


def kquant_isa() -> str | None:
    """The instruction set the library's interleaved kernels run on in this process, as the library itself says:
    "amx" where the CPU and the OS allow AMX tiles (kernels/kquant/kquant_amx.cpp for passes of 8 rows or more, VNNI
    below), "avx512vnni" where the CPU has AVX512VL and AVX512VNNI (kernels/kquant/kquant_vnni.cpp), else "avx2" —
    the same outputs bit for bit; None without the library. ``EDGE_SPEC_KQUANT_ISA=avx2`` or ``=avx512vnni`` keeps
    them on that one (read once)."""
    import ctypes

    path = kquant_library()[0]
    if path is None:
        return None
    fn = getattr(ctypes.CDLL(str(path)), "edge_spec_kquant_isa", None)
    if fn is None:  # a build from before the VNNI kernels
        return "avx2"
    fn.restype = ctypes.c_char_p
    return fn().decode()


def register(options: ort.SessionOptions, needed: tuple[str, ...] | list[str] = ()) -> None:
    """Register the libraries ``needed`` (a manifest's ``custom_ops``) with ``options``.

    Raises ``RuntimeError`` with one sentence when a needed library cannot run here."""
    for name in needed:
        if name != KQUANT:
            raise RuntimeError(f"the graph needs the kernel library '{name}', which this edge-spec does not have")
        path, why = kquant_library()
        if path is None:
            raise RuntimeError(f"the graph uses edge-spec's K-quant kernels, which cannot load: {why}")
        options.register_custom_ops_library(str(path))


def available(name: str = KQUANT) -> bool:
    """Whether the library ``name`` can run here."""
    return name == KQUANT and kquant_library()[0] is not None
