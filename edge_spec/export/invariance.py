"""Batch invariance of the target graph: a token's logits do not depend on how many rows its pass has.

Speculative decoding is lossless only if the target's k-token verify pass computes each row exactly as
the 1-token step of plain decoding would — and "plain decoding" is whatever runs the bundle's target
graph alone: the engine with no drafter, or plain ONNX Runtime feeding one token at a time.

ONNX Runtime's CPU kernels break that for a single row: MatMulNBits with 4-bit weights and int8
activations takes a one-row kernel whose float accumulation differs from its multi-row kernel (up to
~2e-6 per product on onnxruntime 1.32; 8-bit weights are exact), and GroupQueryAttention takes MLAS's
M=1 GEMM for one query row. Amplified through the layers, a 1-token step and the same row of a
verify pass disagree by up to ~0.8 in the logits, enough to flip greedy choices at near-ties.
Passes of two or more rows are row-exact among themselves (each row's arithmetic is the same whatever
the other rows are).

So the graph itself runs a 1-token pass as 2 rows (:func:`pad_rows`): a copy of the token appended to
``input_ids`` (and one more valid position to ``attention_mask``), carried through the layers and dropped
before the LM head when the head is row-exact (8-bit MatMulNBits at int8 activations, fp32 MatMul), else
from the logits; passes of 2 or more rows run as they are. A 1-token step is then the first row of a
2-row pass, computed exactly as that row of any k-row pass — by this engine, by plain ONNX Runtime, by
anyone who runs the graph. The copy's keys/values land at the position after the pass (one scratch
position past the KV capacity, never committed: the next pass overwrites it). A 1-token step costs what
a 2-token pass does: the runtime may put a free guess in that second row. :func:`batch_invariant_rows`
then measures the result bit for bit, and the manifest records it.

A K-quant graph of edge-spec's own (``--gguf-mode kquant``) whose every weight product is row-exact by itself (the
K-quant ops; 8-bit MatMulNBits at int8 activations; fp32 MatMul) and whose attention is the kernel library's
CacheAttention (each row computed alone; what the export writes since that op exists) needs no padding at all.
One exported with GroupQueryAttention needs the second row only where GroupQueryAttention runs: there the
pass's q, k and v gain a copy of their row and the attention output keeps the first S rows, while the matmuls,
norms and activations run on the one row (the padded pass of such a graph costs a 1-row pass plus the attention's
second row, not two rows everywhere).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from edge_spec.bundle import ModelSpec

ATTENTION_OPS = ("GroupQueryAttention", "CacheAttention", "CacheAttentionF32")  # inputs 7, 8: rotary tables
PASS_SIZES = (1, 2, 3, 5, 9)  # verify passes the loop runs: gamma + 1 for gamma up to 8
MIN_PASS = 2  # pad_rows runs every pass with at least this many rows
PAD_ROWS = MIN_PASS - 1  # scratch KV positions past the pass a padded graph may write (ModelSpec.pad_rows)
_PADDED = "/rowpad/"  # name prefix of everything pad_rows adds (a graph that has it is already padded)


def pad_rows(graph: Path) -> bool:
    """Rewrite ``graph`` (model.onnx, weights in external files left untouched) so that a 1-token pass runs as
    2 rows where that is needed; returns whether the graph pads (now, or already before). A graph whose weight
    products are all row-exact and whose attention is the kernel library's (CacheAttention, each row computed
    alone) needs no padding and is left as it is (False). Works on any decoder with the edge-spec interface
    (``input_ids`` [1, S], ``attention_mask`` [1, n + S], ``logits`` [1, S, V], optional ``hidden_states`` /
    ``position_ids``): the ones edge-spec builds and the ORT GenAI model builder's.

    Inputs, when S = 1: ``input_ids`` (and ``position_ids``) gain a copy of their token, ``attention_mask`` one
    more 1; passes of 2 or more rows are left as they are. Outputs: ``logits`` and ``hidden_states`` keep their
    first S rows. Rotary caches read by GroupQueryAttention gain one row (a copy of the last), so a 1-token pass
    may sit at the graph's last position."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph), load_external_data=False)
    g = model.graph
    if any(n.name.startswith(_PADDED) for n in g.node):
        return True
    inputs = {i.name for i in g.input}
    outputs = {o.name for o in g.output}
    if not {"input_ids", "attention_mask", "logits"} <= inputs | outputs:
        raise ValueError(f"{graph} lacks the decoder interface (input_ids, attention_mask, logits)")
    inits = {t.name: t for t in g.initializer}

    def const(name: str, values: list[int]) -> str:
        g.initializer.append(numpy_helper.from_array(np.array(values, dtype=np.int64), _PADDED + name))
        return _PADDED + name

    def node(op: str, ins: list[str], name: str, **attrs) -> str:
        front.append(helper.make_node(op, ins, [_PADDED + name], name=_PADDED + name, **attrs))
        return _PADDED + name

    front: list = []
    one, zero, axis1 = const("one", [1]), const("zero", [0]), const("axis1", [1])
    rows = node("Slice", [node("Shape", ["input_ids"], "shape"), one, const("two", [2])], "rows")  # [S]
    extra = node("Max", [node("Sub", [const("min_pass", [MIN_PASS]), rows], "short"), zero], "extra")  # [max(0, 2-S)]
    pads = node("Concat", [const("pads_head", [0, 0, 0]), extra], "pads", axis=0)  # [1, S] -> [1, S + extra]
    renamed: dict[str, str] = {}
    attention_only = _all_row_exact(g, inits)
    if attention_only and not any(n.op_type == "GroupQueryAttention" for n in g.node):
        return False  # row-exact everywhere (CacheAttention): nothing to pad
    if attention_only:  # q, k, v of each attention gain the copy row; its output keeps the pass's rows
        pads3 = node("Concat", [const("pads3_head", [0, 0, 0, 0]), extra, const("pads3_tail", [0])], "pads3", axis=0)
        back_gqa: dict[str, tuple] = {}
        for n in g.node:
            if n.op_type != "GroupQueryAttention":
                continue
            pre = []
            for j in range(3):
                if j < len(n.input) and n.input[j]:
                    x = n.input[j]
                    padded = f"{_PADDED}{n.name}/in{j}/Pad"
                    pre.append(helper.make_node("Pad", [x, pads3], [padded], name=padded, mode="edge"))
                    n.input[j] = padded
            full = f"{_PADDED}{n.name}/out0"
            out0 = n.output[0]
            n.output[0] = full
            sl = f"{_PADDED}{n.name}/Slice"
            back_gqa[n.name] = (pre, helper.make_node("Slice", [full, zero, rows, axis1], [out0], name=sl))
    for name, mode in (("input_ids", "edge"), ("position_ids", "edge"), ("attention_mask", "constant")):
        if attention_only and name != "attention_mask":
            continue
        if name in inputs:
            renamed[name] = node("Pad", [name, pads, *([one] if mode == "constant" else [])], f"{name}/Pad", mode=mode)
    for n in g.node:
        for j, x in enumerate(n.input):
            if x in renamed:
                n.input[j] = renamed[x]

    producer = {o: n for n in g.node for o in n.output}
    before: dict[str, object] = {}  # node name -> a Slice that must run right before it
    back: list = []
    for name in ("logits", "hidden_states"):
        if name not in outputs or attention_only:
            continue
        n = producer[name]
        if name == "logits" and _row_exact(n, inits):  # drop the row before the LM head: it costs the most
            x = n.input[0]
            sliced = f"{_PADDED}{x}/Slice"
            before[n.name] = helper.make_node("Slice", [x, zero, rows, axis1], [sliced], name=sliced)
            n.input[0] = sliced
            continue
        full = f"{_PADDED}{name}/full"
        n.output[list(n.output).index(name)] = full
        back.append(helper.make_node("Slice", [full, zero, rows, axis1], [name], name=f"{_PADDED}{name}/Slice"))

    extended: set[str] = set()
    for n in g.node:  # rotary tables: the extra row may sit one position past the graph's last
        if n.op_type in ATTENTION_OPS:
            for j in (7, 8):
                if j < len(n.input) and n.input[j] in inits and n.input[j] not in extended:
                    t = inits[n.input[j]]
                    arr = numpy_helper.to_array(t, base_dir=str(graph.parent))
                    t.CopyFrom(numpy_helper.from_array(np.concatenate([arr, arr[-PAD_ROWS:]]), t.name))
                    extended.add(t.name)
    if attention_only:
        nodes = front + [x for n in g.node for x in ((*back_gqa[n.name][0], n, back_gqa[n.name][1])
                                                      if n.name in back_gqa else (n,))]
    else:
        nodes = front + [x for n in g.node for x in ((before[n.name], n) if n.name in before else (n,))]
    del g.node[:]
    g.node.extend(nodes + back)
    tmp = graph.with_suffix(".onnx.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(graph)
    return True


def _all_row_exact(g, inits: dict) -> bool:
    """Is this one of edge-spec's K-quant graphs (the interface this rewrite knows: the mask feeds only the
    attention) whose every weight product computes row r from input row r alone, one-row passes included?"""
    weighted = [n for n in g.node if n.op_type in ("MatMulNBits", "MatMul", "GgufMatMul", "Gemm")]
    return (any(n.op_type == "GgufMatMul" for n in weighted)
            and all(n.op_type == "GgufMatMul" or _row_exact(n, inits) for n in weighted))


def _row_exact(node, inits: dict) -> bool:
    """Is this LM head's output row r a function of its input row r alone, bit for bit at any pass size, one row
    included? 8-bit MatMulNBits with int8 activations (accuracy level 4) and fp32 MatMul of a constant (prepacked)
    weight are (measured on onnxruntime 1.32); 4-bit MatMulNBits, and 8-bit with fp32 activations, are not."""
    from onnx import helper

    if node.op_type == "MatMulNBits":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return attrs.get("bits") == 8 and attrs.get("accuracy_level") == 4
    return node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits


def batch_invariant_rows(graph: Path, spec: ModelSpec, *, prompt: int = 11, seed: int = 0) -> int | None:
    """Smallest ``r`` in (1, 2) such that every pass of >= r rows (padded up to r) gives each row
    the same logits bit for bit as any other pass; ``None`` when neither holds. A graph :func:`pad_rows`
    rewrote is 1 (every pass size agrees with plain 1-token steps).

    Runs random in-vocabulary tokens: a ``prompt``-token prefill, then the same 9 continuation
    tokens fed in passes of each size in PASS_SIZES, and compares all rows with the single steps
    (padded to r rows by the runtime for r = 2).
    """
    from edge_spec.runtime.session import ModelSession

    rng = np.random.default_rng(seed)
    n_new = max(PASS_SIZES)
    ids = rng.integers(3, spec.vocab_size, size=prompt + n_new)
    spec = replace(spec, max_context=prompt + n_new + 4)

    def run(min_rows: int, size: int) -> np.ndarray:
        sess = ModelSession(graph, spec, providers=["CPUExecutionProvider"], device="cpu",
                            capacity=prompt + n_new + 2, max_rows=max(prompt, size), min_rows=min_rows)
        sess.forward(ids[:prompt])
        out = []
        for s in range(prompt, prompt + n_new, size):
            out.append(np.array(sess.forward(ids[s:min(s + size, prompt + n_new)]), dtype=np.float32))
        return np.concatenate(out)

    for min_rows in (1, 2):
        ref = run(min_rows, 1)
        if all(np.array_equal(ref, run(min_rows, size)) for size in PASS_SIZES if size > 1):
            return min_rows
    return None
