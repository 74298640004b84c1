"""Row operations on a linear weight [N out, K in] in any of the encodings the graphs take.

A weight is a float array ``[N, K]`` (HF ``[out, in]``), a ``gguf_quant.QuantWeight`` (MatMulNBits layout) or a
``gguf_split.SplitWeight`` (integer-offset MatMulNBits ``base`` + per-block ``offsets``). Selecting, reordering
and stacking output rows never touches a quantized block (blocks run along K), so every operation is exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

Weight = Any  # gguf_quant.QuantWeight | np.ndarray float [N, K]


def is_quant(w: Weight) -> bool:
    return hasattr(w, "packed") and hasattr(w, "scales")


def is_split(w: Weight) -> bool:
    """A gguf_split.SplitWeight: integer-offset MatMulNBits ``base`` + per-block ``offsets`` [N, K / block]."""
    return hasattr(w, "base") and hasattr(w, "offsets")



def is_kquant(w: Weight) -> bool:
    """A gguf_kquant.KQuantWeight: the file's Q4_K / Q6_K / Q8_0 / Q5_0 / Q4_1 rows, byte for byte (edge-spec's
    own kernels)."""
    return hasattr(w, "ggml_type") and hasattr(w, "data")


def n_rows(w: Weight) -> int:
    """N, the output rows of any encoding."""
    return w.n if is_quant(w) or is_split(w) or is_kquant(w) else int(np.asarray(w).shape[0])


def take_rows(w: Weight, idx: np.ndarray) -> Weight:
    """Rows ``idx`` of a [N, K] weight (output channels); exact for quantized weights, blocks run along K."""
    idx = np.asarray(idx, dtype=np.int64)
    if is_kquant(w):
        return dataclasses.replace(w, n=len(idx), data=np.ascontiguousarray(w.data[idx]))
    if is_split(w):
        return dataclasses.replace(w, base=take_rows(w.base, idx), offsets=np.ascontiguousarray(w.offsets[idx]))
    if not is_quant(w):
        return np.ascontiguousarray(w[idx])
    zp = w.zero_points
    if zp is not None:
        zp = np.ascontiguousarray(zp.reshape(w.n, -1)[idx].reshape(-1))
    return dataclasses.replace(w, n=len(idx), packed=np.ascontiguousarray(w.packed[idx]),
                               scales=np.ascontiguousarray(w.scales.reshape(w.n, -1)[idx].reshape(-1)),
                               zero_points=zp)


def unpermute_qk(w: Weight, n_heads: int) -> Weight:
    """Undo llama.cpp's q/k row permutation (interleaved-rope order -> HF's half-split order)."""
    n = n_rows(w)
    idx = np.arange(n).reshape(n_heads, n // n_heads // 2, 2).transpose(0, 2, 1).reshape(-1)
    return take_rows(w, idx)


def unpermute_vec(b: np.ndarray, n_heads: int) -> np.ndarray:
    n = b.shape[0]
    return np.ascontiguousarray(b.reshape(n_heads, n // n_heads // 2, 2).transpose(0, 2, 1).reshape(-1))


def concat_rows(ws: list[Weight]) -> Weight | None:
    """Stack weights along N (q, k, v -> qkv; pieces of one tensor, :func:`by_rows`) when they share one encoding;
    None when they do not."""
    if any(is_kquant(w) for w in ws):
        if not all(is_kquant(w) for w in ws) or len({(w.ggml_type, w.k) for w in ws}) != 1:
            return None
        return dataclasses.replace(ws[0], n=sum(w.n for w in ws), data=np.concatenate([w.data for w in ws]))
    if any(is_split(w) for w in ws):
        base = concat_rows([w.base for w in ws]) if all(is_split(w) for w in ws) else None
        if base is None:
            return None
        return dataclasses.replace(ws[0], base=base, offsets=np.concatenate([w.offsets for w in ws]),
                                   exact=all(w.exact for w in ws), max_abs_err=max(w.max_abs_err for w in ws),
                                   source_type=base.source_type)
    if all(not is_quant(w) for w in ws):
        return np.concatenate([np.asarray(w, dtype=np.float32) for w in ws], axis=0)
    if all(hasattr(w, "op") for w in ws):  # gguf_quant.GatherWeight: packed [N, bytes], scales / zero points [N, nb]
        if len({(w.op, w.bits, w.block_size, w.k, w.zero_points is None) for w in ws}) != 1:
            return None
        zp = None if ws[0].zero_points is None else np.concatenate([w.zero_points for w in ws])
        return dataclasses.replace(ws[0], n=sum(w.n for w in ws), packed=np.concatenate([w.packed for w in ws]),
                                   scales=np.concatenate([w.scales for w in ws]), zero_points=zp,
                                   exact=all(w.exact for w in ws), max_abs_err=max(w.max_abs_err for w in ws))
    if not all(is_quant(w) for w in ws):
        return None
    a = ws[0]
    kinds = {(w.bits, w.block_size, w.k, None if w.zero_points is None else w.zero_points.dtype.str) for w in ws}
    if len(kinds) != 1:
        return None
    zp = None if a.zero_points is None else np.concatenate([w.zero_points.reshape(-1) for w in ws])
    return dataclasses.replace(a, n=sum(w.n for w in ws), packed=np.concatenate([w.packed for w in ws]),
                               scales=np.concatenate([w.scales.reshape(-1) for w in ws]), zero_points=zp,
                               exact=all(w.exact for w in ws), max_abs_err=max(w.max_abs_err for w in ws),
                               source_type="+".join(sorted({w.source_type for w in ws})))


ROWS_PER_PIECE = 4096  # rows of a GGUF tensor decoded, encoded and checked at a time


class _Rows:
    """Rows ``a:b`` of a gguf ``ReaderTensor``: what the block decoders read (name, tensor_type, data)."""

    def __init__(self, t: Any, a: int, b: int) -> None:
        self.name, self.tensor_type, self.data = t.name, t.tensor_type, np.asarray(t.data)[a:b]


def by_rows(t: Any, convert: Callable[[Any], Weight], rows: int | None = None) -> Weight:
    """``convert(t)`` computed on pieces of ``rows`` output rows and stacked: the same weight (every encoding
    works within a row's blocks), with the float32 temporaries of decoding and checking bounded by one piece
    (the 151,936-row embedding of a 1.5B model would otherwise pass through several GiB of them). ``rows`` None:
    :data:`ROWS_PER_PIECE`."""
    rows = rows or ROWS_PER_PIECE
    data = np.asarray(t.data)
    if data.ndim != 2 or data.shape[0] <= rows:
        return convert(t)
    parts = [convert(_Rows(t, a, min(a + rows, data.shape[0]))) for a in range(0, data.shape[0], rows)]
    out = concat_rows(parts)
    if out is None:
        raise ValueError(f"pieces of {t.name} came out in different encodings")  # row-local encoders: never
    return dataclasses.replace(out, source_type=parts[0].source_type) if hasattr(out, "source_type") else out
