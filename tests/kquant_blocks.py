"""Random but well-formed GGUF K-quant tensors (gguf-py dequantizes Q4_K / Q6_K but cannot quantize to them).

Codes are uniform; scales are chosen so that each sub-block's values centre on 0 (Q4_K: min ~ 7.5 x scale,
Q6_K: codes minus 32) with about ``std`` spread, so a tiny model built from them stays numerically tame.
"""

from __future__ import annotations

import os
import platform

import numpy as np

QK = 256


def kquant_expected() -> bool:
    """Whether pip builds edge-spec's K-quant library here (Linux x86-64 with AVX2, FMA and F16C): there its
    absence is a defect the tests report rather than skip."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next(line for line in open("/proc/cpuinfo", encoding="utf-8") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return all(f in flags for f in ("avx2", "fma", "f16c"))


def kernel_library() -> str:
    """The kernel library's path for a test (``edge_spec.kernels.kquant_library()``; ``EDGE_SPEC_KQUANT_LIB=/path``
    for a build of ``kernels/kquant/build.sh``). Missing where pip builds it (:func:`kquant_expected`) it fails the
    test, unless ``EDGE_SPEC_KQUANT_LIB=none`` asks for that; elsewhere it skips."""
    import pytest

    from edge_spec import kernels

    path, why = kernels.kquant_library()
    if path is None:
        opted_out = os.environ.get("EDGE_SPEC_KQUANT_LIB", "").strip().lower() == "none"
        if kquant_expected() and not opted_out:
            pytest.fail(f"the kernel library should be built on this CPU (x86-64, AVX2, FMA, F16C) but: {why}")
        pytest.skip(f"no kernel library: {why}")
    return str(path)


def random_q4_k(rng: np.random.Generator, n: int, k: int, std: float = 0.08) -> np.ndarray:
    """uint8 [n, k / 256 * 144]: Q4_K super-blocks (fp16 d, fp16 dmin = d, 12 bytes of 6-bit scales/mins, 128 bytes
    of nibbles). Scale bytes 0..7 keep their top bits 0, so sub-blocks 0..3 take scale sc (1..8) and min m from bytes
    j and j + 4, sub-blocks 4..7 the nibbles of bytes 8..11 (sc 1..2)."""
    nb = n * (k // QK)
    d = np.full(nb, std / 20.0, dtype=np.float16)
    sc_lo = rng.integers(1, 9, size=(nb, 4))
    sc_hi = rng.integers(1, 3, size=(nb, 4))
    scales = np.empty((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = sc_lo
    scales[:, 4:8] = np.rint(7.5 * sc_lo)
    scales[:, 8:12] = sc_hi | (np.rint(7.5 * sc_hi).astype(np.int64) << 4)
    qs = rng.integers(0, 256, size=(nb, 128), dtype=np.uint8)
    blocks = np.concatenate([d.view(np.uint8).reshape(nb, 2), d.view(np.uint8).reshape(nb, 2), scales, qs], axis=1)
    return np.ascontiguousarray(blocks.reshape(n, -1))


def random_q6_k(rng: np.random.Generator, n: int, k: int, std: float = 0.08) -> np.ndarray:
    """uint8 [n, k / 256 * 210]: Q6_K super-blocks (128 bytes low nibbles, 64 bytes high bits, 16 int8 scales 1..8,
    fp16 d); values d * scale * (code - 32)."""
    nb = n * (k // QK)
    ql = rng.integers(0, 256, size=(nb, 128), dtype=np.uint8)
    qh = rng.integers(0, 256, size=(nb, 64), dtype=np.uint8)
    sc = rng.integers(1, 9, size=(nb, 16)).astype(np.int8).view(np.uint8)
    d = np.full(nb, std / 80.0, dtype=np.float16)
    blocks = np.concatenate([ql, qh, sc, d.view(np.uint8).reshape(nb, 2)], axis=1)
    return np.ascontiguousarray(blocks.reshape(n, -1))


def random_kquant(rng: np.random.Generator, type_name: str, n: int, k: int, std: float = 0.08) -> np.ndarray:
    return (random_q4_k if type_name == "Q4_K" else random_q6_k)(rng, n, k, std)
