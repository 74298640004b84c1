"""GGUF float-offset types (Q4_1, Q4_K, Q2_K, Q5_1, Q5_K) as two exact pieces on ONNX Runtime's fast kernels.

``--gguf-mode split`` (docs/export.md): w = s*q + m per (sub-)block becomes D + M with D = s*(q - z) in
MatMulNBits with integer zero points z and M = m + z*s per block, so x @ W^T = MatMulNBits(x; D) +
blocksum(x) @ M^T (the graph side is ``graph_linear.split_linear``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edge_spec.export.gguf_blocks import Codes
from edge_spec.export.gguf_quant import QuantWeight, _pack_rows, _to_quant, convert, dequantize


@dataclass(frozen=True)
class SplitWeight:
    """A float-offset GGUF tensor W [N, K] = D + M, each piece exact in float32, for ONNX Runtime's fast kernels.

    ``base`` holds D = (q - z) * s as MatMulNBits with *integer* zero points z per block (4-bit codes with uint8
    zero points, or 5-bit codes on 8 bits as q - z + 128 under the default zero point 128); ``offsets``
    [N, K // block_size] holds M = m + z * s, m the file's offset of the block (Q4_1's m, Q4_K's -dmin*min). Then
    x @ W^T = MatMulNBits(x; base) + blocksum(x) @ offsets^T, blocksum(x) [..., K // block_size] = the sums of x
    over each block. ``exact``: fp32(D + M) equals ``gguf.quants.dequantize`` bit for bit (-0 == +0).
    """

    base: QuantWeight
    offsets: np.ndarray  # float32 [N, K // block_size]
    exact: bool
    max_abs_err: float
    source_type: str

    @property
    def n(self) -> int:
        return self.base.n

    @property
    def k(self) -> int:
        return self.base.k

    @property
    def bits(self) -> int:
        return self.base.bits

    @property
    def block_size(self) -> int:
        return self.base.block_size


def _split_codes(c: Codes, source_type: str) -> SplitWeight:
    """Float-offset codes -> SplitWeight; ``exact``/``max_abs_err`` are filled in by the caller.

    w = q*s + m is written as (q - z)*s + (m + z*s) with an integer z per block chosen to centre the codes
    (z = round(-m/s), so D ~ w and M is at most s/2): at accuracy_level 4 ORT rounds x to int8 for the D
    part only, and that error times an uncentred D (all codes >= 0) would not cancel against the exact
    blocksum(x) * m. Both pieces stay exact: (q - z)*s is exact in fp32 and z is kept only where m + z*s is
    exactly a float32 (else z = 0, M = m); fp32(D + M) then rounds the same real number gguf rounds.
    """
    n, k = c.q.shape
    nb = k // c.block_size
    s64, m64 = c.scales.astype(np.float64), -c.t.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.clip(np.rint(np.where(s64 != 0, -m64 / s64, 0)), 0, c.levels - 1)
    m_new = m64 + z * s64
    ok = m_new.astype(np.float32).astype(np.float64) == m_new
    z = np.where(ok, z, 0).astype(np.int16)
    offsets = np.where(ok, m_new, m64).astype(np.float32)
    q = c.q.reshape(n, nb, -1).astype(np.int16)
    if c.levels <= 16:  # (u - z) * s with uint8 zero points: the fast integer kernel
        bits, u, zp = 4, q, _pack_rows(z.astype(np.uint8), 4).reshape(-1)
    else:  # 8 bits: u = q - z + 128 under the default zero point 128 (no zero-point input)
        bits, u, zp = 8, q - z[..., None] + 128, None
    packed = _pack_rows(u.astype(np.uint8).reshape(n, k), bits).reshape(n, nb, c.block_size * bits // 8)
    base = QuantWeight(bits, c.block_size, k, n, packed, c.scales.reshape(-1).astype(np.float32), zp, False, 0.0,
                       source_type)
    d_real = (q - z[..., None]).astype(np.float64) * s64[..., None]  # the real D; fp32 must hold it exactly
    d_exact = bool((dequantize(base).reshape(d_real.shape).astype(np.float64) == d_real).all())
    return SplitWeight(replace(base, exact=d_exact), offsets, False, 0.0, source_type)


def split_from_gguf(t: object) -> SplitWeight | QuantWeight | np.ndarray:
    """A gguf ``ReaderTensor`` of a linear weight [N, K] -> SplitWeight for float-offset types (Q4_1, Q4_K, Q2_K,
    Q5_1, Q5_K); integer-offset types come back as :func:`from_gguf` gives them, float types as float32 [N, K]."""
    return convert(t, lambda c, name: _to_quant(c, name) if c.t is None else _split_codes(c, name))
