"""VocabTrim: keep the drafter LM-head rows of the K tokens the target produces most.

The kept ids are stored sorted ascending (``id_map[i]`` = target id of draft id i), so the
inverse map is a ``searchsorted`` and the draft logits keep the target's id order. The
graph is rewritten in place: the LM head's weight (MatMulNBits rows, with scales, zero
points and bias; or float MatMul columns) is sliced to the kept ids and the ``logits``
output's last dimension becomes K. Nothing else in the graph changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_spec.errors import ExportError

DEFAULT_SHARE = 0.99  # 'auto': smallest K covering 99% of target-produced calibration tokens


@dataclass(frozen=True)
class KeptSet:
    ids: np.ndarray  # int32 [K], sorted ascending, unique
    coverage: float  # share of calibration tokens inside the set
    calibration_tokens: int


def choose_kept(counts: np.ndarray, k: int | str, always_keep: tuple[int, ...] | list[int],
                share: float = DEFAULT_SHARE) -> KeptSet:
    """Top tokens by target frequency (ties: lower id first) plus ``always_keep``; ``k`` an int or 'auto'."""
    vocab = len(counts)
    total = int(counts.sum())
    if total == 0:
        raise ExportError("The target produced no calibration tokens, so nothing tells which tokens to keep; "
                          "pass --calibration with more prompts or --trim-vocab off.")
    always = sorted({int(i) for i in always_keep if 0 <= int(i) < vocab})
    order = np.lexsort((np.arange(vocab), -counts))  # by count desc, then id asc
    if k == "auto":
        ranked = order[counts[order] > 0]
        cum = np.cumsum(counts[ranked]) / total
        n = int(np.searchsorted(cum, share - 1e-12) + 1)
        chosen = set(ranked[:n].tolist()) | set(always)
    else:
        k = int(k)
        if k < len(always):
            raise ExportError(f"--trim-vocab {k} is smaller than the {len(always)} special and stop tokens that "
                              "must be kept; pass a larger K.")
        chosen = set(always)
        for i in order.tolist():
            if len(chosen) >= min(k, vocab):
                break
            chosen.add(i)
    ids = np.array(sorted(chosen), dtype=np.int32)
    return KeptSet(ids=ids, coverage=float(counts[ids].sum() / total), calibration_tokens=total)


def to_draft_ids(id_map: np.ndarray, target_ids: np.ndarray) -> np.ndarray:
    """Target ids -> draft ids (-1 where a target id is not kept)."""
    pos = np.searchsorted(id_map, target_ids)
    pos = np.clip(pos, 0, len(id_map) - 1)
    return np.where(id_map[pos] == target_ids, pos, -1).astype(np.int32)


def _producer(graph, name: str):
    for node in graph.node:
        if name in node.output:
            return node
    return None


def trim_lm_head(graph_path: Path, kept: np.ndarray) -> tuple[int, int]:
    """Rewrite the graph's LM head to output logits for ``kept`` ids only; returns LM-head bytes (before, after)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph_path), load_external_data=True)
    g = model.graph
    node = _producer(g, "logits")
    while node is not None and node.op_type in ("Cast", "Identity"):
        node = _producer(g, node.input[0])
    if node is None or node.op_type not in ("MatMulNBits", "MatMul"):
        raise ExportError(f"Cannot find the drafter's LM head in {graph_path.name} (logits come from "
                          f"{getattr(node, 'op_type', 'nothing')}); export with --trim-vocab off.")
    inits = {t.name: t for t in g.initializer}
    idx = np.asarray(kept, dtype=np.int64)
    before = after = 0

    def replace(pos: int, sliced_fn) -> None:
        nonlocal before, after
        name = node.input[pos]
        if not name or name not in inits:
            return
        arr = numpy_helper.to_array(inits[name])
        new = np.ascontiguousarray(sliced_fn(arr))
        before += arr.nbytes
        after += new.nbytes
        new_name = f"{name}.vocab_trim"  # new tensor: a tied embedding may still read the old one
        g.initializer.append(numpy_helper.from_array(new, new_name))
        node.input[pos] = new_name

    if node.op_type == "MatMulNBits":
        attrs = {a.name: a for a in node.attribute}
        n, kdim = attrs["N"].i, attrs["K"].i
        blocks = -(-kdim // attrs["block_size"].i)

        def rows(per_row: int):
            return lambda a: a.reshape(n, -1)[idx].reshape(-1) if a.ndim == 1 else a[idx]

        replace(1, rows(0))  # B: [N, blocks, blob]
        replace(2, rows(blocks))  # scales: [N, blocks] or flat [N * blocks]
        if len(node.input) > 3:
            replace(3, rows(0))  # zero points: [N, packed] or flat
        if len(node.input) > 5 and node.input[5]:
            replace(5, lambda a: a[idx])  # bias [N]
        attrs["N"].i = len(idx)
    else:
        if node.input[1] not in inits:
            raise ExportError("The drafter's LM head weight is not a constant; export with --trim-vocab off.")
        replace(1, lambda a: a[:, idx])  # [hidden, vocab] -> [hidden, K]
    used = {i for nd in g.node for i in nd.input}
    for t in list(g.initializer):
        if t.name not in used:
            g.initializer.remove(t)
    for out in g.output:
        if out.name == "logits":
            out.type.tensor_type.shape.dim[-1].ClearField("dim_param")
            out.type.tensor_type.shape.dim[-1].dim_value = len(idx)
    for vi in list(g.value_info):
        if vi.name in node.output:
            g.value_info.remove(vi)
    data = graph_path.with_name(graph_path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing external-data file
    onnx.save_model(model, str(graph_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    return before, after
