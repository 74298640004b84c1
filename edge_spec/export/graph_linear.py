"""y = x @ W^T in each encoding a weight may have in edge-spec's own graphs, and the LM head that ends them.

A ``gguf_quant.QuantWeight`` becomes MatMulNBits, a ``SplitWeight`` MatMulNBits plus the block sums of x times the
block offsets, a ``KQuantWeight`` edge-spec's ``GgufMatMul`` on the file's super-blocks, a float array ``[N, K]`` a
MatMul. :func:`keep_rows` gives graphs whose LM head computes each row alone the optional ``logits_to_keep`` input.
"""

from __future__ import annotations

import numpy as np

from edge_spec.export.graph_writer import CUSTOM_DOMAIN, LOGITS_TO_KEEP, GraphWriter
from edge_spec.export.weights import Weight, is_kquant, is_quant, is_split


def blocksum(g: GraphWriter, x: str, k: int, block: int) -> str:
    """[1, S, K] -> [1, S, K / block]: the sum of x over each block of ``block`` along K (once per input)."""
    key = (x, block)
    if key not in g.blocksums:
        name = f"{x.rsplit('/output_', 1)[0]}/blocksum{block}"
        shape = g.init(f"blocksum.shape.{k}.{block}", np.array([0, 0, k // block, block], dtype=np.int64))
        xb = g.node("Reshape", [x, shape], f"{name}/Reshape")[0]
        g.blocksums[key] = g.node("ReduceSum", [xb, g.init("axes_last", np.array([-1], dtype=np.int64))],
                                  f"{name}/ReduceSum", keepdims=0)[0]
    return g.blocksums[key]


def split_linear(g: GraphWriter, x: str, w: Weight, name: str, level: int, outputs: list[str] | None = None) -> str:
    """y = x @ W^T for a SplitWeight: MatMulNBits(x; d*q, integer zero points) + blocksum(x) @ offsets^T."""
    d = linear(g, x, w.base, f"{name}/MatMulNBits", level)
    mb = g.init(f"{name}.block_offsets", np.ascontiguousarray(w.offsets.T, dtype=np.float32))  # [K / block, N]
    m = g.node("MatMul", [blocksum(g, x, w.k, w.block_size), mb], f"{name}/offsets/MatMul")[0]
    return g.node("Add", [d, m], f"{name}/offsets/Add", outputs=outputs)[0]


def gguf_matmul(g: GraphWriter, x: str, w: Weight, name: str, init: str, outputs: list[str] | None = None) -> str:
    """y = x @ W^T straight from a KQuantWeight's super-blocks (edge_spec::GgufMatMul, kernels/kquant/)."""
    b = init if g.has(init) else g.init(init, w.graph_bytes())
    return g.node("GgufMatMul", [x, b], name, domain=CUSTOM_DOMAIN, outputs=outputs, ggml_type=w.ggml_type,
                  interleave=w.interleave)[0]


def linear(g: GraphWriter, x: str, w: Weight, name: str, level: int) -> str:
    """y = x @ W^T for W [N, K]: MatMulNBits for a QuantWeight, MatMulNBits + block offsets for a SplitWeight,
    GgufMatMul for a KQuantWeight, MatMul otherwise."""
    if is_kquant(w):
        return gguf_matmul(g, x, w, f"{name}/GgufMatMul", f"{name}.gguf_blocks")
    if is_split(w):
        return split_linear(g, x, w, name, level)
    if is_quant(w):
        ins = [x, g.init(f"{name}.qweight", w.packed), g.init(f"{name}.scales", w.scales.reshape(-1))]
        if w.zero_points is not None:
            ins.append(g.init(f"{name}.zero_points", w.zero_points.reshape(-1)))
        return g.node("MatMulNBits", ins, name, domain="com.microsoft", K=w.k, N=w.n, bits=w.bits,
                      block_size=w.block_size, accuracy_level=level)[0]
    wt = np.ascontiguousarray(np.asarray(w, dtype=np.float32).T)  # [K, N]
    return g.node("MatMul", [x, g.init(f"{name}.weight", wt)], name)[0]


def rows_alone(w: Weight, level: int) -> bool:
    """Does the LM head compute each output row from its input row alone, bit for bit whatever the row count?
    GgufMatMul (kernels/kquant), 8-bit MatMulNBits with int8 activations and fp32 MatMul of a constant do (export/
    invariance.py's _row_exact, measured); 4-bit MatMulNBits and the split form's MatMulNBits + offsets need not."""
    if is_kquant(w):
        return True
    if is_split(w):
        return False
    if is_quant(w):
        return w.bits == 8 and level == 4
    return True


def keep_rows(g: GraphWriter, x: str) -> str:
    """The final norm's output [1, S, H] -> its last ``logits_to_keep`` rows [1, K, H] (0, the default: all S).

    ``logits_to_keep`` is a graph input with a default initializer (ONNX IR >= 4: overridable), so a caller that
    never binds it gets every row, as before; a prefill pass binds 1 and skips the LM head for the other rows
    (transformers' ``logits_to_keep``; llama.cpp computes only the logits a batch asks for). Each row of the LM
    head depends on its own input row only (:func:`rows_alone`; graphs whose head does not lack the input), so
    the logits kept are those an all-rows pass computes, bit for bit."""
    keep = g.init(LOGITS_TO_KEEP, np.array([0], dtype=np.int64))
    start = g.node("Neg", [keep], "/keep/Neg")[0]
    end = g.init("/keep/end", np.array([np.iinfo(np.int64).max], dtype=np.int64))
    return g.node("Slice", [x, start, end, g.init("/keep/axis", np.array([1], dtype=np.int64))], "/keep/Slice")[0]


def lm_head(g: GraphWriter, x: str, w: Weight, tied: bool, level: int, out: str = "logits") -> str:
    """logits = x @ W^T for the LM head ``w``; ``tied``: ``w`` is the embedding, whose initializers it reads."""
    if is_kquant(w):  # tied: the embedding's own initializer
        init = "embed.gguf_blocks" if tied else "lm_head.gguf_blocks"
        return gguf_matmul(g, x, w, "/lm_head/GgufMatMul", init, outputs=[out])
    if tied and is_quant(w) and not hasattr(w, "op"):  # tied: the embedding's own blocks
        return g.node("MatMulNBits", [x, "embed.blocks", "embed.scales"], "/lm_head/MatMulNBits", outputs=[out],
                      domain="com.microsoft", K=w.k, N=w.n, bits=w.bits, block_size=w.block_size,
                      accuracy_level=level)[0]
    if is_split(w):
        return split_linear(g, x, w, "/lm_head", level, outputs=[out])
    if is_quant(w):
        ins = [x, g.init("lm_head.qweight", w.packed), g.init("lm_head.scales", w.scales.reshape(-1))]
        if w.zero_points is not None:
            ins.append(g.init("lm_head.zero_points", w.zero_points.reshape(-1)))
        return g.node("MatMulNBits", ins, "/lm_head/MatMulNBits", outputs=[out], domain="com.microsoft",
                      K=w.k, N=w.n, bits=w.bits, block_size=w.block_size, accuracy_level=level)[0]
    wt = np.ascontiguousarray(np.asarray(w, dtype=np.float32).T)
    return g.node("MatMul", [x, g.init("lm_head.weight", wt)], "/lm_head/MatMul", outputs=[out])[0]
