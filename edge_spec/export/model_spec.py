"""The manifest entry (``bundle.ModelSpec``) of one exported graph: its interface, sizes and measured memory."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_spec.bundle import ModelSpec, Quantization, SharedInitializer, kv_bytes_per_token
from edge_spec.export import build, graph_writer, measure, own_build

if TYPE_CHECKING:
    from edge_spec.export.options import ExportOptions, Quant


def head_size(cfg: dict) -> int:
    """Per-head width of a Hugging Face-style config (``head_dim``, else hidden / heads)."""
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def model_spec(root: Path, role: str, ckpt: build.Checkpoint, q: Quant, level: int, opts: ExportOptions,
               max_ctx: int, full_vocab: int, shared: list[SharedInitializer] | None = None,
               beside: tuple[Path, int] | None = None, features: tuple[int, ...] | None = None) -> ModelSpec:
    """The manifest entry of ``root/role/model.onnx``, its load and workspace memory measured unless the options
    say not to. ``level``: the MatMulNBits accuracy level it was built at. ``features``: the aux layers of an
    EAGLE-3 pair (the target outputs them as ``hidden_states``, the drafter reads them as ``target_hidden``)."""
    import onnx

    cfg = ckpt.config
    graph = root / role / "model.onnx"
    proto = onnx.load(str(graph), load_external_data=False)
    past = next(i for i in proto.graph.input if i.name.startswith("past_key_values."))
    logits = next(o for o in proto.graph.output if o.name == "logits")
    io_dtype = "float16" if logits.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else "float32"
    kv_dtype = "float16" if past.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else "float32"
    kv_field = None if kv_dtype == io_dtype else kv_dtype  # absent when equal: older readers see the same manifest
    vocab = logits.type.tensor_type.shape.dim[-1].dim_value or int(cfg["vocab_size"])
    layers, kv_heads, head = int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads")
                                                                 or cfg["num_attention_heads"]), head_size(cfg)
    data = [p for p in sorted((root / role).iterdir()) if p.name.endswith(".data")]
    # the drafter reads the shared embedding through the target's mapping: count its pages once, with the target
    gather = measure.gather_table_bytes(proto, skip={t.name for t in shared or []} if role == "drafter" else set())
    if opts.measure_memory:
        mem = measure.measure_memory(graph, max_ctx, head, shared=[asdict(t) for t in shared or []], root=root,
                                     beside=beside)
    else:
        mem = {"load_bytes": 0, "workspace_bytes": {1: 0}}
    quantized = q.precision in ("int4", "int8")
    quant = Quantization(precision=q.precision, block_size=opts.block_size if quantized else None,
                         accuracy_level=level if quantized else None, io_dtype=io_dtype, kv_dtype=kv_field)
    tensors: list[dict[str, Any]] = []
    if isinstance(ckpt, own_build.Source):
        tensors = ckpt.report
        if ckpt.kind == "gguf":  # the file's own precision, not the --quant option
            prec, block = own_build.precision_of(tensors)
            quant = Quantization(precision=prec, block_size=block, accuracy_level=level, io_dtype=io_dtype,
                                 kv_dtype=kv_field)
    genai = root / role / "genai_config.json"
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key": "past_key_values.%d.key", "past_value": "past_key_values.%d.value"}
    outputs = {"logits": "logits", "present_key": "present.%d.key", "present_value": "present.%d.value"}
    outs = {o.name: o for o in proto.graph.output}
    extra: dict[str, Any] = {}
    if "hidden_states" in outs:
        outputs["hidden_states"] = "hidden_states"
        extra = {"feature_layers": list(features or ()),
                 "feature_dim": outs["hidden_states"].type.tensor_type.shape.dim[-1].dim_value}
    if any(i.name == "target_hidden" for i in proto.graph.input):
        inputs.update(target_hidden="target_hidden", prev_hidden="prev_hidden")
        outputs["hidden_out"] = "hidden_out"
        extra = {"kind": "eagle3", "feature_layers": list(features or ()), "feature_dim": int(cfg["feature_dim"])}
    return ModelSpec(
        graph=f"{role}/model.onnx", data_files=tuple(f"{role}/{p.name}" for p in data),
        architecture=ckpt.architecture, quantization=quant, num_layers=layers,
        num_attention_heads=int(cfg["num_attention_heads"]), num_kv_heads=kv_heads, head_size=head,
        hidden_size=int(cfg["hidden_size"]), vocab_size=int(vocab), full_vocab_size=int(full_vocab),
        max_context=max_ctx, weight_bytes=sum(p.stat().st_size for p in [graph, *data]),
        load_bytes=int(mem["load_bytes"]),
        load_peak_bytes=int(mem["load_peak_bytes"]) if "load_peak_bytes" in mem else None, gather_bytes=gather,
        kv_bytes_per_token=kv_bytes_per_token(layers, kv_heads, head, kv_dtype),
        workspace_bytes=dict(mem["workspace_bytes"]),
        input_names=inputs, output_names=outputs,
        genai_config=f"{role}/genai_config.json" if genai.is_file() else None,
        tensors=tensors, custom_ops=graph_writer.custom_ops_of(proto),
        row_tables=[f"{role}/{f}" for f in measure.row_table_files(proto) if (root / role / f).is_file()], **extra,
    )
