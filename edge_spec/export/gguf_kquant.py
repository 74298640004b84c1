"""GGUF K-quant tensors (Q4_K, Q6_K; and Q8_0, Q5_0, Q4_1) carried into the graph byte for byte, for edge-spec's
kernels.

``--gguf-mode kquant`` (docs/export.md): a Q4_K or Q6_K linear weight keeps the file's super-blocks and runs
through the custom op ``edge_spec::GgufMatMul`` (kernels/kquant/; the runtime registers the library,
edge_spec/kernels.py); a K-quant embedding is read by ``edge_spec::GgufGather`` from the same bytes (a
tied LM head shares them). Q8_0, Q5_0 and Q4_1 layer weights (blocks of 32: what a Q4_K_M file stores where a
row is not a multiple of 256, and all of a Q8_0 or Q4_1 file) whose row count is a multiple of 8 run on GgufMatMul too
(:func:`supports`); their embeddings and LM heads keep ONNX Runtime's ops. Rows are reordered (VocabTrim,
llama.cpp's q/k permutation, q|k|v and gate|up stacking) on the file's rows; when the graph is written, a
tensor whose row count is a multiple of 8 is interleaved by 8 rows (:func:`interleave8`, a permutation of its
bytes — of Q5_0's fifth bits too: one 256-bit load then holds 8 rows' codes). Nothing is decoded or re-encoded,
so the weights are the file's exactly, at the file's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GGML_Q4_1, GGML_Q5_0, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K = 3, 6, 8, 12, 14
BLOCK_BYTES = {GGML_Q4_K: 144, GGML_Q6_K: 210, GGML_Q5_0: 22, GGML_Q8_0: 34, GGML_Q4_1: 20}  # bytes of one block
BLOCK_VALUES = {GGML_Q4_K: 256, GGML_Q6_K: 256, GGML_Q5_0: 32, GGML_Q8_0: 32, GGML_Q4_1: 32}  # values of one block
BITS = {GGML_Q4_K: 4, GGML_Q6_K: 6, GGML_Q5_0: 5, GGML_Q8_0: 8, GGML_Q4_1: 4}  # the file's nominal bits
TYPE_NAMES = {GGML_Q4_K: "Q4_K", GGML_Q6_K: "Q6_K", GGML_Q5_0: "Q5_0", GGML_Q8_0: "Q8_0", GGML_Q4_1: "Q4_1"}
TYPE_IDS = {v: k for k, v in TYPE_NAMES.items()}
SMALL = ("Q5_0", "Q8_0", "Q4_1")  # blocks of 32: the kernels take them interleaved by 8 only
QK = 256


@dataclass(frozen=True)
class KQuantWeight:
    """A GGUF Q4_K / Q6_K / Q8_0 / Q5_0 / Q4_1 tensor W [N out, K in] as the file's rows of blocks: ``data`` uint8 [N,
    K / block values * block bytes], row n the file's row n (ggml's ``ne[1]`` index)."""

    ggml_type: int  # 12 Q4_K | 14 Q6_K | 8 Q8_0 | 6 Q5_0 | 3 Q4_1
    k: int
    n: int
    data: np.ndarray  # uint8 [N, K // BLOCK_VALUES[ggml_type] * BLOCK_BYTES[ggml_type]]
    source_type: str
    exact: bool = True
    max_abs_err: float = 0.0

    @property
    def bits(self) -> int:  # for the manifest's tensor rows: the file's nominal bits
        return BITS[self.ggml_type]

    @property
    def block_size(self) -> int:
        return BLOCK_VALUES[self.ggml_type]

    @property
    def interleave(self) -> int:
        """8 when the graph stores the rows interleaved by 8 (N a multiple of 8), else 0 (the file's order)."""
        return 8 if self.n % 8 == 0 else 0

    def graph_bytes(self) -> np.ndarray:
        """uint8 [N, row bytes] as the graph stores them (:attr:`interleave`)."""
        return interleave8(self.data, self.ggml_type) if self.interleave == 8 else self.data


def is_kquant(w: object) -> bool:
    return isinstance(w, KQuantWeight)


def supports(tensor_type_name: str, rows: int | None = None) -> bool:
    """Can the kernels run a tensor of this GGUF type? Q4_K / Q6_K always (matrix products and lookups); Q8_0 /
    Q5_0 / Q4_1 for matrix products of ``rows`` (N) a multiple of 8 (interleaved layouts only: pass None for a lookup
    or an LM head, whose rows VocabTrim may change)."""
    if tensor_type_name in ("Q4_K", "Q6_K"):
        return True
    return tensor_type_name in SMALL and rows is not None and rows % 8 == 0


def from_gguf(t: object) -> KQuantWeight:
    """A gguf ``ReaderTensor`` of a :func:`supports` type, [N, K] -> its bytes (a copy: the file's pages can go)."""
    name = t.tensor_type.name
    gt = TYPE_IDS[name]
    data = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8))
    n, row = data.shape
    return KQuantWeight(gt, row // BLOCK_BYTES[gt] * BLOCK_VALUES[gt], n, data.copy(), name)


def interleave8(data: np.ndarray, ggml_type: int) -> np.ndarray:
    """Rows [N, nb * bytes] (N a multiple of 8) -> the same bytes interleaved by 8 rows, the layouts of
    kernels/kquant/kquant.h (``Q4_K_X8``, ``Q6_K_X8``, ``Q8_0_X8``, ``Q5_0_X8``, ``Q4_1_X8``: there Q5_0's 5th bits
    are also regrouped by chunk, the same bits moved)."""
    n, row = data.shape
    per = BLOCK_BYTES[ggml_type]
    g, nb = n // 8, row // per
    b = data.reshape(g, 8, nb, per).transpose(0, 2, 1, 3)  # [group, block, row, bytes]
    if ggml_type == GGML_Q8_0:
        parts = [b[..., 0:2],  # d: [g, i, row, 2]
                 b[..., 2:34].reshape(g, nb, 8, 8, 4).transpose(0, 1, 3, 2, 4)]  # qs [g, i, t, row, 4]
    elif ggml_type == GGML_Q5_0:  # the 5th bits regrouped: word c holds nibble c of each row's qh, row r at bit 4 r
        qh = np.ascontiguousarray(b[..., 2:6]).view("<u4")[..., 0].astype(np.uint64)  # [g, i, row]
        nib = (qh[..., None] >> (4 * np.arange(8, dtype=np.uint64))) & 0xF  # [g, i, row, chunk]
        words = (nib << (4 * np.arange(8, dtype=np.uint64))[:, None]).sum(axis=2).astype("<u4")  # [g, i, chunk]
        parts = [b[..., 0:2], words.view(np.uint8),  # d [g, i, row, 2]; masks [g, i, 32]
                 b[..., 6:22].reshape(g, nb, 8, 4, 4).transpose(0, 1, 3, 2, 4)]  # qs [g, i, t, row, 4]
    elif ggml_type == GGML_Q4_1:
        parts = [b[..., 0:2], b[..., 2:4],  # d, m: [g, i, row, 2]
                 b[..., 4:20].reshape(g, nb, 8, 4, 4).transpose(0, 1, 3, 2, 4)]  # qs [g, i, t, row, 4]
    elif ggml_type == GGML_Q4_K:
        parts = [b[..., 0:2], b[..., 2:4],  # d, dmin: [g, i, row, 2]
                 b[..., 4:16].reshape(g, nb, 8, 3, 4).transpose(0, 1, 3, 2, 4),  # scale words [g, i, word, row, 4]
                 b[..., 16:].reshape(g, nb, 8, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5)]  # qs [g, i, j, t, row, 4]
    else:
        ql = b[..., :128].reshape(g, nb, 8, 2, 2, 8, 4)  # [g, i, row, h, half, t, 4]
        qh = b[..., 128:192].reshape(g, nb, 8, 2, 8, 4)  # [g, i, row, h, t, 4]
        q = np.stack([ql[:, :, :, :, 0], ql[:, :, :, :, 1], qh], axis=4)  # [g, i, row, h, part, t, 4]
        parts = [b[..., 208:210],  # d
                 b[..., 192:208].reshape(g, nb, 8, 4, 4).transpose(0, 1, 3, 2, 4),  # scale words [g, i, word, row, 4]
                 q.transpose(0, 1, 3, 5, 4, 2, 6)]  # [g, i, h, t, part, row, 4]
    flat = [np.ascontiguousarray(p).reshape(g, nb, -1) for p in parts]
    return np.ascontiguousarray(np.concatenate(flat, axis=-1)).reshape(n, row)


def dequantize(w: KQuantWeight) -> np.ndarray:
    """float32 [N, K]: gguf-py's dequantization of the file's rows (export checks and tests only)."""
    import gguf

    qt = gguf.GGMLQuantizationType(w.ggml_type)
    return np.asarray(gguf.quants.dequantize(w.data, qt), dtype=np.float32).reshape(w.n, w.k)
