"""Writing a decoder graph: nodes and initializers as they are made, the weights streamed to external data.

:class:`GraphWriter` collects nodes and initializers; given the graph's path it appends each initializer of
1 KiB or more to its external-data file at once (the embedding's ``embed.*`` to :data:`EMBED_DATA`, so two
graphs built on one embedding hold byte-identical files), so a model's weights never sit in memory twice.
:func:`save_graph` adds the decoder interface (input_ids, attention_mask, KV in / out, logits) and saves;
:func:`share_embedding` keeps one copy of two graphs' identical embedding files, :func:`shared_initializers`
lists what the runtime then maps once for both sessions.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_spec.bundle import SharedInitializer


@dataclass(frozen=True)
class KVLayout:
    """The KV cache inputs / outputs: element type ("float32" | "float16"), KV heads, head size."""

    dtype: str
    heads: int
    head_dim: int


EMBED_DATA = "embed.data"  # the embedding's own external-data file (identical bytes in target and drafter)
EXTERNAL_MIN_BYTES = 1024  # smaller initializers stay inside model.onnx


class GraphWriter:
    """A small graph writer: nodes, initializers, unique names.

    Given ``out_path`` (what :func:`save_graph` needs), initializers of 1 KiB or more are written to the graph's
    external-data files as they are made (the embedding's ``embed.*`` to :data:`EMBED_DATA`, the rest to
    ``<out_path>.data``) and only their places kept: the graph's weights are never held twice in memory."""

    def __init__(self, out_path: Path | None = None) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._names: set[str] = set()
        self.blocksums: dict[tuple[str, int], str] = {}  # (input, block) -> its block sums, shared by q/k/v etc.
        self._files: dict[str, Any] = {}
        self.out_path = out_path
        if out_path is not None:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            for f in (out_path.name + ".data", EMBED_DATA):
                (out_path.parent / f).unlink(missing_ok=True)

    def _external(self, t: Any) -> Any:
        """``t`` (TensorProto) with its raw bytes appended to its external-data file, when large enough."""
        from onnx.external_data_helper import set_external_data

        if self.out_path is None or len(t.raw_data) < EXTERNAL_MIN_BYTES:
            return t
        loc = EMBED_DATA if t.name.startswith("embed.") else self.out_path.name + ".data"
        if loc not in self._files:
            self._files[loc] = open(self.out_path.parent / loc, "wb")  # noqa: SIM115 - closed by close()
        f = self._files[loc]
        offset = f.tell()
        f.write(t.raw_data)
        set_external_data(t, loc, offset, len(t.raw_data))
        t.ClearField("raw_data")
        return t

    def close(self) -> None:
        """Flush and close the external-data files (after the last initializer)."""
        for f in self._files.values():
            f.close()
        self._files.clear()

    def init(self, name: str, arr: np.ndarray) -> str:
        from onnx import numpy_helper

        if name not in self._names:
            self._names.add(name)
            self.inits.append(self._external(numpy_helper.from_array(np.ascontiguousarray(arr), name)))
        return name

    def has(self, name: str) -> bool:
        """Whether an initializer ``name`` was already written (a tied weight's second reader)."""
        return name in self._names

    def add(self, inits: list[Any], nodes: list[Any]) -> None:
        """Initializers (TensorProto) and nodes made elsewhere, e.g. by :func:`gguf_quant.gather_onnx`."""
        for t in inits:
            if t.name not in self._names:
                self._names.add(t.name)
                self.inits.append(self._external(t))
        self.nodes.extend(nodes)

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, domain: str = "", outputs=None,
             **attrs: Any) -> list[str]:
        from onnx import helper

        outs = outputs or [f"{name}/output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain or None, **attrs))
        return outs


LOGITS_TO_KEEP = "logits_to_keep"  # optional graph input [1] int64: logits of the last K rows only; 0 = all
CUSTOM_DOMAIN = "edge_spec"  # the ops of edge-spec's own kernel library (kernels/kquant/)


def custom_ops_of(proto: Any) -> list[str]:
    """The kernel libraries an ONNX model needs (the manifest's ``custom_ops``): ["edge_spec.kquant"] or []."""
    return ["edge_spec.kquant"] if any(o.domain == CUSTOM_DOMAIN for o in proto.opset_import) else []


def save_graph(g: GraphWriter, n_layers: int, vocab_out: int, out_path: Path, kv: KVLayout,
               extra_inputs: list | None = None, extra_outputs: list | None = None,
               name: str = "edge_spec_decoder") -> Path:
    """The decoder interface (input_ids, attention_mask, KV in / out, logits) plus ``extra_*`` value infos, saved
    with external data (the embedding in :data:`EMBED_DATA`)."""
    import onnx
    from onnx import TensorProto, helper

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_t = TensorProto.FLOAT16 if kv.dtype == "float16" else f32
    past = ["batch_size", kv.heads, "past_sequence_length", kv.head_dim]
    pres = ["batch_size", kv.heads, "total_sequence_length", kv.head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
              *(extra_inputs or [])]
    keeps = any(i.name == LOGITS_TO_KEEP for i in extra_inputs or [])  # fewer logits rows than input rows
    rows = "logits_sequence_length" if keeps else "sequence_length"
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch_size", rows, vocab_out]),
               *(extra_outputs or [])]
    for kind in ("key", "value"):
        inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", kv_t, past) for i in range(n_layers)]
        outputs += [helper.make_tensor_value_info(f"present.{i}.{kind}", kv_t, pres) for i in range(n_layers)]
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    if any(n.domain == CUSTOM_DOMAIN for n in g.nodes):  # edge-spec's own kernels (edge_spec/kernels.py)
        opsets.append(helper.make_opsetid(CUSTOM_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="edge-spec")
    model.ir_version = 10
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if g.out_path != out_path:
        raise ValueError(f"the graph was written for {g.out_path}, not {out_path}")
    g.close()  # every large initializer already sits in its external-data file
    onnx.save_model(model, str(out_path))
    mask = os.umask(0)
    os.umask(mask)
    for f in out_path.parent.glob("*.data"):  # onnx creates external data 0600; a bundle is meant to be shared
        f.chmod(0o666 & ~mask)
    return out_path


def share_embedding(target_dir: Path, drafter_dir: Path, say: Any) -> dict[str, Any] | None:
    """Target and drafter built on the same embedding hold byte-identical embed.data files: keep one on disk
    (a hard link; a copy where the file system has none). ONNX Runtime refuses external-data paths with '..',
    so each graph keeps a file of that name next to it."""
    a, b = target_dir / EMBED_DATA, drafter_dir / EMBED_DATA
    if not (a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)):
        return None
    b.unlink()
    try:
        os.link(a, b)
        linked = True
    except OSError:
        shutil.copy2(a, b)
        linked = False
    say(f"[share] the drafter's embedding is the target's ({a.stat().st_size / 1e6:.1f} MB, "
        f"{'stored once (hard link)' if linked else 'copied: no hard links on this file system'})")
    return {"file": EMBED_DATA, "bytes": a.stat().st_size, "hard_link": linked}


_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 7: "int64", 10: "float16"}


def shared_initializers(root: Path, roles: tuple[str, str] = ("target", "drafter")) -> list[SharedInitializer]:
    """The initializers both graphs keep in their (identical, shared) :data:`EMBED_DATA` file at the same offset:
    the runtime maps them once for both sessions. Empty when the graphs share no embedding."""
    import onnx

    found: list[dict[tuple, Any]] = []
    for role in roles:
        proto = onnx.load(str(root / role / "model.onnx"), load_external_data=False)
        entries = {}
        for t in proto.graph.initializer:
            ext = {e.key: e.value for e in t.external_data}
            if ext.get("location") == EMBED_DATA and t.data_type in _ONNX_DTYPES:
                entries[t.name] = (int(ext.get("offset", 0)), int(ext["length"]), _ONNX_DTYPES[t.data_type],
                                   tuple(int(d) for d in t.dims))
        found.append(entries)
    a, b = (root / roles[0] / EMBED_DATA), (root / roles[1] / EMBED_DATA)
    if not (a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)):
        return []
    return [SharedInitializer(name, f"{roles[0]}/{EMBED_DATA}", off, length, dtype, shape)
            for name, (off, length, dtype, shape) in sorted(found[0].items()) if found[1].get(name) == found[0][name]]
