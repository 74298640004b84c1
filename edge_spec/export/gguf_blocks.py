"""GGUF quantized blocks -> their codes, scales and offsets, unpacked exactly as ``gguf.quants`` reads them.

Two affine forms cover every supported type: ``w = (q - offset) * s`` (an integer offset: Q4_0, Q5_0, Q8_0,
Q3_K, Q6_K) and ``w = fp32(q * s) - t`` (a float offset: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K). gguf_quant.py and
gguf_split.py map them onto ONNX Runtime operators; :func:`reference` and :func:`compare` check the result
against gguf's own float32 dequantization.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_spec.errors import ExportError

QK_K = 256  # elements per k-quant super-block


@dataclass(frozen=True)
class Codes:
    """A GGUF tensor in one of two affine forms, unpacked: [N, K] codes, [N, nb] scales."""

    q: np.ndarray  # uint8 [N, K]; "int": w = (q - offset) * s; "float": w = fp32(q * s) - t
    scales: np.ndarray  # float32 [N, nb]
    t: np.ndarray | None  # float32 [N, nb] for "float", None for "int"
    offset: int  # integer offset for "int"
    levels: int  # q < levels
    block_size: int


# ---------------------------------------------------------------- GGUF block decoders (mirror gguf.quants)
def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """[nb, groups*width] bytes -> [nb, groups*2*width] codes: per group the low nibbles, then the high ones."""
    x = qs.reshape(qs.shape[0], -1, 1, width) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (x & 0x0F).reshape(qs.shape[0], -1)


def _qh_bits(qh: np.ndarray, n: int) -> np.ndarray:
    """Q5_0/Q5_1: bit j of the little-endian uint32 ``qh`` is the fifth bit of element j."""
    bits = np.ascontiguousarray(qh).view(np.uint32).reshape(-1, 1) >> np.arange(n, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins per super-block."""
    d, m, m_d = np.split(scales.reshape(-1, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1).reshape(-1, 8)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1).reshape(-1, 8)
    return sc, mn


def _decode(name: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int, int]:
    """GGUF blocks [nblocks, type_size] -> (q [nblocks, elems], s [nblocks, subs], t or None, offset, levels, bs).

    Every float32 product is formed exactly as gguf.quants forms it (same operands, same order).
    """
    if name == "Q4_0":
        return _nibbles(b[:, 2:], 16), _f16(b[:, :2]), None, 8, 16, 32
    if name == "Q4_1":
        return _nibbles(b[:, 4:], 16), _f16(b[:, :2]), -_f16(b[:, 2:4]), 0, 16, 32
    if name == "Q5_0":
        return _nibbles(b[:, 6:], 16) | (_qh_bits(b[:, 2:6], 32) << 4), _f16(b[:, :2]), None, 16, 32, 32
    if name == "Q5_1":
        q = _nibbles(b[:, 8:], 16) | (_qh_bits(b[:, 4:8], 32) << 4)
        return q, _f16(b[:, :2]), -_f16(b[:, 2:4]), 0, 32, 32
    if name == "Q8_0":
        return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), _f16(b[:, :2]), None, 128, 256, 32
    n = b.shape[0]
    if name == "Q2_K":
        sc, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
        q = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        return q.reshape(n, QK_K), d * (sc & 0xF).astype(np.float32), dmin * (sc >> 4).astype(np.float32), 0, 4, 16
    if name == "Q3_K":
        hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
        lo = (scales[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
        hi = (scales[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
        sc = (((lo & 0x0F) | ((hi & 0x03) << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
        ql = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)).reshape(n, QK_K) & 3
        qh = (hmask.reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)).reshape(n, QK_K) & 1
        return (ql + (qh << 2)), d * sc, None, 4, 8, 16  # ql - 4*(1-h) + 4 = ql + 4h
    if name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
        sc, mn = _k_scale_min(b[:, 4:16])
        if name == "Q4_K":
            q, levels = _nibbles(b[:, 16:], 32), 16
        else:
            qh = (b[:, 16:48].reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
            q, levels = _nibbles(b[:, 48:], 32) | (qh.reshape(n, QK_K) << 4), 32
        return q, d * sc.astype(np.float32), dmin * mn.astype(np.float32), 0, levels, 32
    if name == "Q6_K":
        ql = _nibbles(b[:, :128], 64)
        qh = (b[:, 128:192].reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        d = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
        return ql | (qh.reshape(n, QK_K) << 4), d, None, 32, 64, 16
    raise KeyError(name)


_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
SUPPORTED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def codes(t: object) -> Codes | np.ndarray:
    """A gguf ReaderTensor -> its codes, or a float32 array [N, K] (numpy order) for float types."""
    import gguf  # heavy optional dependency, export only

    name = t.tensor_type.name
    data = np.asarray(t.data)
    if name in _FLOAT_TYPES:
        return np.ascontiguousarray(gguf.quants.dequantize(data, t.tensor_type), dtype=np.float32)
    if name not in SUPPORTED_TYPES:
        raise ExportError(f"GGUF tensor {t.name} is stored as {name}, which edge-spec cannot map onto ONNX Runtime "
                          f"operators; re-quantize the GGUF to a supported type ({', '.join(SUPPORTED_TYPES)}).")
    if data.ndim != 2:
        raise ExportError(f"GGUF tensor {t.name} has {data.ndim} dimensions; only 2-D quantized weights are "
                          "supported, so export this model from its Hugging Face checkpoint instead.")
    block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
    n = data.shape[0]
    k = data.shape[1] // type_size * block
    q, s, off, int_off, levels, bs = _decode(name, data.reshape(-1, type_size))
    return Codes(q.reshape(n, k).astype(np.uint8), s.reshape(n, k // bs).astype(np.float32),
                  None if off is None else off.reshape(n, k // bs).astype(np.float32), int_off, levels, bs)


def reference(t: object) -> np.ndarray:
    import gguf

    return np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)


def compare(ours: np.ndarray, ref: np.ndarray) -> tuple[bool, float]:
    """(bitwise equal with -0 == +0, max |diff|); +0.0 maps -0 to +0 and leaves every other bit pattern alone."""
    a, b = (ours + np.float32(0)).view(np.uint32), (ref.reshape(ours.shape) + np.float32(0)).view(np.uint32)
    return bool(np.array_equal(a, b)), float(np.abs(ours - ref.reshape(ours.shape)).max(initial=0.0))
