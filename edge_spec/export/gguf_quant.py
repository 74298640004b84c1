"""GGUF quantized blocks -> ONNX Runtime quantized operators, bit for bit where the kernels allow it.

A GGUF tensor is never dequantized and re-quantized: its own codes, scales and offsets are rewritten into the
layout of ``com.microsoft.MatMulNBits`` (linear layers, tied LM head) or ``GatherBlockQuantized`` (embedding),
so that the weight the graph sees equals ``gguf.quants.dequantize`` of the file (what transformers loads).

onnxruntime 1.31.1 CPU kernels, probed with one-node graphs (A = identity, or one row; 576 x 1536 for timing,
one thread, median of 100 calls):

===========================  =====  =========  ========  ==========================  ===========================
operator                     bits   block      uint8 zp  float zp                    time, accuracy_level 1 / 4
===========================  =====  =========  ========  ==========================  ===========================
MatMulNBits                  4      16,32,64   yes       yes                         129 / 54 us; float zp 7.7 ms
MatMulNBits                  2      16,32,64   yes       yes                         (not timed)
MatMulNBits                  8      16,32,64   yes       no: "Only 2b and 4b ..."    6.7 ms (all levels 0-3) / 62 us
MatMul, fp32 weight          -      -          -         -                           202 us
GatherBlockQuantized uint8   4, 8   16, 32     yes       no: type error at load      -
===========================  =====  =========  ========  ==========================  ===========================

Integer zero points dequantize as ``(q - zp) * s`` (default zp 2^(bits-1)); float zero points as
``fp32(q*s) - fp32(z*s)``: two roundings, no fused multiply-add (16k random values; M = 1 and M = K agree;
at accuracy_level 4 float zero points still compute in fp32 on these exact weights).
Float zero points (any level) and 8 bits below accuracy_level 4 run slow fallbacks (the weight dequantized on
every call, ~60x slower; an fp32 MatMul of the same exact values is ~38x faster): for a fast graph use
accuracy_level 4 and ``float_zero_points=False``.

Per GGUF type (``exact``: equal to gguf's float32 dequantization, -0 and +0 counted equal — a MatMul cannot
tell them apart):

======  ==========================================  =============================================================
type    MatMulNBits                                 exact?
======  ==========================================  =============================================================
Q4_0    4-bit, block 32, default zp 8               always
Q8_0    8-bit, block 32, int8 + 128, default zp     always
Q5_0    8-bit, block 32, q + 112, default zp        always
Q3_K    4-bit, block 16, q + 8, s = d*sc            always
Q6_K    8-bit, block 16, q + 96, s = d*sc           always
Q4_1    4-bit, block 32, float zp (z*d == -m)       per block where a float32 z hits the offset (99.97 % of
Q4_K    4-bit, block 32, float zp, s = d*sc         SmolLM2's Q4_1 blocks), else off by 1 ulp of the offset;
Q2_K    4-bit, block 16, float zp, s = d*sc         with float_zero_points=False: 8-bit, error <= s/32 (s/128)
Q5_1    8-bit, block 32, s/8 with uint8 zp          no: offset rounded to a multiple of s/8 (error <= s/16)
Q5_K    8-bit, block 32, s/8 with uint8 zp          no: same
F32/F16/BF16: float32 arrays (exact); IQ*, TQ*, MXFP4, ...: refused with ExportError
======  ==========================================  =============================================================

For the embedding, integer-offset types map onto GatherBlockQuantized; float-offset types (Q4_1, Q4_K, Q2_K,
Q5_1, Q5_K) use a small subgraph of standard operators (Gather, BitShift, Cast, Mul, Sub) computing
``fp32(q*s) - t`` with the file's own offset t: exact for every supported type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_spec.errors import ExportError
from edge_spec.export.gguf_blocks import Codes, codes, compare, reference
from edge_spec.export.weights import by_rows


@dataclass(frozen=True)
class QuantWeight:
    """A [K, N] MatMul weight (y = x @ W) in MatMulNBits layout; rows below are the N output features."""

    bits: int  # 4 or 8
    block_size: int  # 16 or 32 (along K)
    k: int
    n: int
    packed: np.ndarray  # uint8 [N, K // block_size, block_size * bits // 8]   (MatMulNBits input B)
    scales: np.ndarray  # float32 [N * (K // block_size)]
    zero_points: np.ndarray | None  # uint8 packed (4-bit [N * ceil(nb/2)], 8-bit [N * nb]) or float32 [N * nb];
    #                                 None = symmetric default (8 / 128)
    exact: bool  # graph dequant == GGUF dequant bit for bit
    max_abs_err: float
    source_type: str  # GGUF type name, e.g. "Q4_1"


@dataclass(frozen=True)
class GatherWeight:
    """An embedding table [N rows (tokens), K] for ``op``.

    ``op == "GatherBlockQuantized"``: attrs gather_axis=0, quantize_axis=1, block_size, bits; w = (q - zp) * s.
    ``op == "GatherDecode"``: the subgraph of :func:`gather_onnx`; ``zero_points`` is float32 [N, nb] holding the
    offset t of w = fp32(q * s) - t (not a MatMulNBits-style zero point).
    """

    op: str
    bits: int
    block_size: int
    k: int
    n: int
    packed: np.ndarray  # uint8 [N, K * bits // 8]
    scales: np.ndarray  # float32 [N, K // block_size]
    zero_points: np.ndarray | None  # GBQ: uint8 [N, ceil(nb * bits / 8)] or None (default 8 / 128); decode: float32
    exact: bool
    max_abs_err: float
    source_type: str


# ---------------------------------------------------------------- packing
def _pack_rows(u: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [N, M] -> [N, M * bits // 8], element j of a byte in its low bits first (ORT's order)."""
    if bits == 8:
        return np.ascontiguousarray(u, dtype=np.uint8)
    if u.shape[1] % 2:
        u = np.concatenate([u, np.zeros((u.shape[0], 1), np.uint8)], axis=1)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)


def _unpack_rows(p: np.ndarray, bits: int, m: int) -> np.ndarray:
    """Inverse of :func:`_pack_rows`: [N, bytes] -> uint8 codes [N, m]."""
    if bits == 8:
        return p[:, :m]
    return np.stack([p & 0x0F, p >> 4], axis=-1).reshape(p.shape[0], -1)[:, :m]


def _solve_zero_points(s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32 z with fp32(z * s) closest to t, whether it hits t exactly); s != 0. t is not always reachable."""
    z0 = (t.astype(np.float64) / s.astype(np.float64)).astype(np.float32)
    best, best_err = z0, np.abs(z0 * s - t)
    up = down = z0
    for _ in range(4):  # the product moves by <= ~2 ulps per step of z; 4 steps each way cover every reachable t
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        for cand in (up, down):
            err = np.abs(cand * s - t)
            better = err < best_err
            best, best_err = np.where(better, cand, best), np.where(better, err, best_err)
    return best.astype(np.float32), best_err == 0


def _float_zp_4bit(c: Codes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float-offset codes with <= 16 levels -> (u [N, K], s [N, nb], z [N, nb]) for 4-bit float zero points.

    ORT forms fp32(u*s) - fp32(z*s); gguf forms fp32(q*s) - t, and q*s is exact in fp32 (<= 21 significant bits).
    So a block is bitwise exact iff some float32 z has fp32(z*s) == t — true for ~90 % of Q4_1 blocks. For the
    rest, other encodings of the same weights are tried: u = a + q with scale s, or u = a - q with scale -s (any a
    keeping u in 0..15); they need fp32(z*(±s)) == ±a*s + t instead, which is again exactly representable.
    """
    n, nb = c.scales.shape
    s, t = c.scales.copy(), c.t
    sign, shift = np.ones((n, nb), np.float32), np.zeros((n, nb), np.int16)
    flat = s == 0  # w = 0*q - t, but ORT's z*0 would be 0: write u = 0 (at the end), s = 1, z = t instead
    s[flat] = 1.0
    z, done = _solve_zero_points(s, t)
    done |= flat
    q = c.q.reshape(n, nb, -1).astype(np.int16)
    qmin, qmax = q.min(axis=-1), q.max(axis=-1)
    for sg in (1, -1):
        for a in range(16):
            lo, hi = (qmin + a, qmax + a) if sg == 1 else (a - qmax, a - qmin)  # range of u = a + sg*q
            todo = ~done & (lo >= 0) & (hi <= 15)
            if (sg, a) == (1, 0) or not todo.any():
                continue
            target64 = sg * a * s[todo].astype(np.float64) + t[todo]
            target = target64.astype(np.float32)
            zc, hit = _solve_zero_points(sg * s[todo], target)
            hit &= target.astype(np.float64) == target64
            idx = tuple(i[hit] for i in np.nonzero(todo))
            z[idx], sign[idx], shift[idx], done[idx] = zc[hit], sg, a, True
    u = shift[..., None] + sign.astype(np.int16)[..., None] * q
    u[flat] = 0
    return u.astype(np.uint8).reshape(n, -1), (s * sign).astype(np.float32), z


def _float_offset_8bit(c: Codes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float-offset codes -> (u [N, K], s' [N, nb], zp uint8 [N, nb]) for 8-bit integer zero points.

    8-bit MatMulNBits takes only integer zero points, so w = q*s - t becomes (u - zp) * s/k with u = k*q + c and
    c - zp = round(-k*t/s): the offset is rounded to a multiple of s/k. The largest power of two k whose codes fit
    in a byte is used (error <= s/(2k): k = 8 for 32 levels, 16 for 16, 64 for 4); a block that fits none is
    re-quantized symmetrically from its values.
    """
    n, nb = c.scales.shape
    q = c.q.reshape(n, nb, -1).astype(np.int64)
    s, t = c.scales.astype(np.float64), c.t.astype(np.float64)
    qmax = q.max(axis=-1)
    k_out, c_out, r_out = np.zeros((n, nb)), np.zeros((n, nb)), np.zeros((n, nb))
    done = np.zeros((n, nb), bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in (64, 32, 16, 8, 4, 2, 1):
            r = np.rint(-k * t / s)
            lo, hi = np.maximum(0, r), np.minimum(255 - k * qmax, 255 + r)
            ok = ~done & (s != 0) & np.isfinite(r) & (lo <= hi)
            k_out[ok], c_out[ok], r_out[ok] = k, lo[ok], r[ok]
            done |= ok
    u = (k_out[..., None] * q + c_out[..., None]).astype(np.uint8)
    zp = (c_out - r_out).astype(np.uint8)
    scale = np.where(done, c.scales / np.where(done, k_out, 1), 0).astype(np.float32)  # s/k: exact (power of 2)
    if not done.all():  # degenerate blocks (s == 0, or an offset far outside the codes): symmetric re-quantization
        w = (c.q.reshape(n, nb, -1) * c.scales[..., None] - c.t[..., None]).astype(np.float32)
        amax = np.abs(w).max(axis=-1)
        fb = np.where(amax > 0, amax / 127, 1.0).astype(np.float32)
        uq = (np.clip(np.rint(w / fb[..., None]), -127, 127) + 128).astype(np.uint8)
        u[~done], zp[~done], scale[~done] = uq[~done], 128, fb[~done]
    return u.reshape(n, -1), scale, zp


def _to_quant(c: Codes, source_type: str, float_zero_points: bool = True) -> QuantWeight:
    """Codes -> MatMulNBits layout; ``exact``/``max_abs_err`` are filled in by the caller."""
    n, k = c.q.shape
    if c.t is None:  # integer offset: shift the codes so the kernel's default zero point applies
        bits = 4 if c.levels <= 16 else 8
        u, s, zp = (c.q.astype(np.int16) - c.offset + (1 << (bits - 1))).astype(np.uint8), c.scales, None
    elif c.levels <= 16 and float_zero_points:
        bits, (u, s, zp) = 4, _float_zp_4bit(c)
        zp = zp.reshape(-1)
    else:
        bits, (u, s, zp) = 8, _float_offset_8bit(c)
        zp = zp.reshape(-1)
    packed = _pack_rows(u, bits).reshape(n, k // c.block_size, c.block_size * bits // 8)
    return QuantWeight(bits, c.block_size, k, n, packed, s.reshape(-1).astype(np.float32), zp, False, 0.0,
                       source_type)


def convert(t: object, encode: Callable[[Codes, str], Any]) -> Any:
    """A gguf ``ReaderTensor`` [N, K] on its one way through export: decoded once (:func:`gguf_blocks.codes`),
    encoded once (``encode(codes, type name)``), checked once (:func:`dequantize` of the result against
    ``gguf.quants.dequantize``, bit for bit: ``exact``, ``max_abs_err``), in pieces of rows (``weights.by_rows``).
    Float types come back as float32 [N, K], never encoded."""

    def piece(p: object) -> Any:
        c = codes(p)
        if isinstance(c, np.ndarray):
            return c
        w = encode(c, p.tensor_type.name)
        exact, err = compare(dequantize(w), reference(p))
        return replace(w, exact=exact and (w.base.exact if hasattr(w, "base") else True), max_abs_err=err)

    return by_rows(t, piece)


def from_gguf(t: object, float_zero_points: bool = True) -> QuantWeight | np.ndarray:
    """A gguf ``ReaderTensor`` of a linear weight [N out, K in] -> MatMulNBits weight, or float32 [N, K] (float types).

    ``float_zero_points=False`` never emits float zero points, which ONNX Runtime runs ~60x slower (it dequantizes
    the whole weight on every call): Q4_1/Q4_K/Q2_K then become 8-bit with integer zero points (fast at
    accuracy_level 4 only), their offsets rounded to s/32 (Q4_*) or s/128 (Q2_K).
    """
    return convert(t, lambda c, name: _to_quant(c, name, float_zero_points))


def gather_from_gguf(t: object) -> GatherWeight | np.ndarray:
    """A gguf ``ReaderTensor`` of an embedding [N tokens, K hidden] -> GatherWeight, or float32 [N, K]."""
    return convert(t, _to_gather)


def _to_gather(c: Codes, source_type: str) -> GatherWeight:
    """Codes -> GatherBlockQuantized (integer offsets) or the Gather + decode subgraph's inputs (float offsets)."""
    n, k = c.q.shape
    if c.t is None:
        qw = _to_quant(c, source_type)  # same codes and scales; GBQ's default zero points match
        return GatherWeight("GatherBlockQuantized", qw.bits, qw.block_size, k, n, qw.packed.reshape(n, -1),
                            qw.scales.reshape(n, -1), None, False, 0.0, source_type)
    bits = 4 if c.levels <= 16 else 8
    return GatherWeight("GatherDecode", bits, c.block_size, k, n, _pack_rows(c.q, bits), c.scales, c.t, False, 0.0,
                        source_type)


def dequantize(q: QuantWeight | GatherWeight | Any) -> np.ndarray:
    """float32 [N, K] the way ONNX Runtime forms it (formulas measured, see the module docstring).

    For a ``gguf_split.SplitWeight``: fp32(D + M), the weight the two pieces stand for (the graph never forms it)."""
    if hasattr(q, "base") and hasattr(q, "offsets"):
        d = dequantize(q.base).reshape(q.n, -1, q.block_size)
        return (d + q.offsets[..., None]).astype(np.float32).reshape(q.n, q.k)
    n, k, bs = q.n, q.k, q.block_size
    nb = k // bs
    u = _unpack_rows(q.packed.reshape(n, -1), q.bits, k).reshape(n, nb, bs).astype(np.float32)
    s = q.scales.reshape(n, nb, 1).astype(np.float32)
    zp = q.zero_points
    if isinstance(q, GatherWeight) and q.op == "GatherDecode":
        w = u * s - zp.reshape(n, nb, 1)
    elif zp is None:
        w = (u - np.float32(1 << (q.bits - 1))) * s
    elif zp.dtype == np.float32:
        w = u * s - zp.reshape(n, nb, 1) * s
    else:
        w = (u - _unpack_rows(zp.reshape(n, -1), q.bits, nb).reshape(n, nb, 1).astype(np.float32)) * s
    return w.astype(np.float32).reshape(n, k)


def quantize_float(w: np.ndarray, bits: int = 4, block_size: int = 32) -> QuantWeight:
    """float32 [N, K] -> round-to-nearest blocks: 4-bit asymmetric (uint8 zero points), 8-bit symmetric (zp 128)."""
    if bits not in (4, 8) or block_size not in (16, 32) or w.ndim != 2 or w.shape[1] % block_size:
        raise ExportError(f"cannot quantize a {w.shape} weight to {bits} bits in blocks of {block_size}; use bits 4 "
                          "or 8, block 16 or 32, and a 2-D weight whose K is a multiple of the block size.")
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    blocks = w.reshape(n, k // block_size, block_size)
    if bits == 8:
        s = np.abs(blocks).max(axis=-1) / 127
        s = np.where(s > 0, s, 1).astype(np.float32)
        u = (np.clip(np.rint(blocks / s[..., None]), -127, 127) + 128).astype(np.uint8)
        zp = None
    else:
        lo, hi = np.minimum(blocks.min(axis=-1), 0), np.maximum(blocks.max(axis=-1), 0)
        s = np.where(hi > lo, (hi - lo) / 15, 1).astype(np.float32)
        z = np.clip(np.rint(-lo / s), 0, 15).astype(np.uint8)
        u = np.clip(np.rint(blocks / s[..., None]) + z[..., None], 0, 15).astype(np.uint8)
        zp = _pack_rows(z, 4).reshape(-1)
    packed = _pack_rows(u.reshape(n, k), bits).reshape(n, k // block_size, block_size * bits // 8)
    qw = QuantWeight(bits, block_size, k, n, packed, s.reshape(-1), zp, False, 0.0, "F32")
    return replace(qw, max_abs_err=float(np.abs(dequantize(qw) - w).max(initial=0.0)))


def matmulnbits_node_attrs(q: QuantWeight, accuracy_level: int) -> dict[str, int]:
    """Attributes of the com.microsoft MatMulNBits node for ``q``."""
    return {"K": q.k, "N": q.n, "bits": q.bits, "block_size": q.block_size, "accuracy_level": accuracy_level}


# ---------------------------------------------------------------- ONNX emission
def matmulnbits_onnx(q: QuantWeight, name: str, input_name: str, output_name: str,
                     accuracy_level: int) -> tuple[list, object]:
    """(initializers, node) computing output [..., N] = input [..., K] @ W with ``q``'s blocks."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(q.packed, f"{name}.qweight"), numpy_helper.from_array(q.scales, f"{name}.scales")]
    if q.zero_points is not None:
        inits.append(numpy_helper.from_array(q.zero_points, f"{name}.qzeros"))
    node = helper.make_node("MatMulNBits", [input_name, *(i.name for i in inits)], [output_name], name=name,
                            domain="com.microsoft", **matmulnbits_node_attrs(q, accuracy_level))
    return inits, node


def gather_onnx(g: GatherWeight, name: str, ids_name: str, output_name: str) -> tuple[list, list]:
    """(initializers, nodes) computing output [*ids.shape, K] = rows ``ids`` of the table (opset >= 18)."""
    from onnx import TensorProto, helper, numpy_helper

    data, scales = numpy_helper.from_array(g.packed, f"{name}.qweight"), numpy_helper.from_array(g.scales,
                                                                                                 f"{name}.scales")
    if g.op == "GatherBlockQuantized":
        inits = [data, scales] + ([] if g.zero_points is None else
                                  [numpy_helper.from_array(g.zero_points, f"{name}.qzeros")])
        ins = [data.name, ids_name, scales.name] + [i.name for i in inits[2:]]
        return inits, [helper.make_node("GatherBlockQuantized", ins, [output_name], name=name, domain="com.microsoft",
                                        gather_axis=0, quantize_axis=1, block_size=g.block_size, bits=g.bits)]
    nb = g.k // g.block_size
    p = f"{name}/"
    consts = {"offsets": g.zero_points, "flat": np.array([-1], np.int64), "blocks": np.array([-1, nb, g.block_size],
              np.int64), "k": np.array([g.k], np.int64), "axis": np.array([-1], np.int64),
              **({"mask": np.array(15, np.uint8), "four": np.array(4, np.uint8)} if g.bits == 4 else {})}
    inits = [data, scales] + [numpy_helper.from_array(v, f"{name}.{k}") for k, v in consts.items()]
    c = {k: f"{name}.{k}" for k in consts}
    mk = helper.make_node
    nodes = [mk("Reshape", [ids_name, c["flat"]], [p + "ids"]),
             mk("Gather", [data.name, p + "ids"], [p + "bytes"], axis=0)]  # [T, K * bits / 8]
    codes = p + "bytes"
    if g.bits == 4:  # low nibble is the even element (see _pack_rows)
        nodes += [mk("BitwiseAnd", [codes, c["mask"]], [p + "lo"]),
                  mk("BitShift", [codes, c["four"]], [p + "hi"], direction="RIGHT"),
                  mk("Unsqueeze", [p + "lo", c["axis"]], [p + "lo3"]),
                  mk("Unsqueeze", [p + "hi", c["axis"]], [p + "hi3"]),
                  mk("Concat", [p + "lo3", p + "hi3"], [p + "codes"], axis=-1)]
        codes = p + "codes"
    nodes += [mk("Cast", [codes], [p + "q"], to=TensorProto.FLOAT),
              mk("Reshape", [p + "q", c["blocks"]], [p + "qb"]),  # [T, nb, bs]
              mk("Gather", [scales.name, p + "ids"], [p + "s"], axis=0),
              mk("Unsqueeze", [p + "s", c["axis"]], [p + "s3"]),
              mk("Gather", [c["offsets"], p + "ids"], [p + "t"], axis=0),
              mk("Unsqueeze", [p + "t", c["axis"]], [p + "t3"]),
              mk("Mul", [p + "qb", p + "s3"], [p + "qs"]), mk("Sub", [p + "qs", p + "t3"], [p + "w"]),  # fp32(q*s) - t
              mk("Shape", [ids_name], [p + "ids_shape"]),
              mk("Concat", [p + "ids_shape", c["k"]], [p + "out_shape"], axis=0),
              mk("Reshape", [p + "w", p + "out_shape"], [output_name])]
    return inits, nodes
