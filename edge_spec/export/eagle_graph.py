"""The EAGLE-3 feature drafter as an ONNX graph (see :mod:`edge_spec.distill.eagle` for the math).

Interface: the decoder one (``input_ids`` [1, k], ``attention_mask`` [1, n + k], one layer of
``past_key_values`` / ``present`` bound as one buffer, ``logits`` [1, k, draft vocab]) plus

* ``target_hidden`` [1, k, F] float16 — the target's features at each row (F = aux layers x target hidden),
* ``prev_hidden`` [1, k, H] float32 — the head's own pre-norm output from an earlier draft step,
* ``hidden_out`` [1, k, H] float32 — this pass's pre-norm output (the next draft step's ``prev_hidden``).

The layer reads ``h = fc(target_hidden) + prev_hidden``: a row fed from the target binds zeros as
``prev_hidden``, a draft step binds zeros as ``target_hidden``, so one graph serves both without a branch.
The token embedding is the target's (same initializers, shared in the bundle); q/k/v read the concat
[input_layernorm(embedding), hidden_norm(h)] of width 2H, as the published heads do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_spec.errors import ExportError
from edge_spec.export import graph_linear
from edge_spec.export.graph_writer import GraphWriter, save_graph
from edge_spec.export.onnx_graph import (
    Decoder,
    GraphSpec,
    Layer,
    Weight,
    _attention,
    _embedding,
    _mlp,
    kv_layout,
    prologue,
)

ARCH = "LlamaForCausalLMEagle3"


@dataclass
class EagleWeights:
    """A head's graph weights. ``layer.attn_norm`` is ``input_layernorm`` (on the embedding), ``layer.ffn_norm``
    ``post_attention_layernorm``; q/k/v are [*, 2H], fc [H, F], lm_head [draft vocab, H]; ``embed`` is the
    target's."""

    fc: Weight
    layer: Layer
    hidden_norm: np.ndarray
    final_norm: np.ndarray
    lm_head: Weight
    embed: Weight
    feature_dim: int


def is_eagle3_dir(path: Path) -> bool:
    """A directory whose config.json names an EAGLE-3 architecture (ours or a published head)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "eagle3" in str((cfg.get("architectures") or [""])[0]).lower()


def read_head_numpy(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json, tensors) of a head directory, tensor names without a ``model.`` prefix; float as float32."""
    from safetensors.numpy import load_file

    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ExportError(f"The EAGLE-3 head '{path}' has no .safetensors weights; it needs model.safetensors.")
    out: dict[str, np.ndarray] = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except Exception as exc:  # safetensors raises its own error types for a damaged file
            raise ExportError(f"The EAGLE-3 head file '{f}' cannot be read ({str(exc)[:120]}); re-download or "
                              "re-train it.") from None
        for k, v in tensors.items():
            out[k.removeprefix("model.")] = v if v.dtype in (np.int64, np.int32, np.bool_) else v.astype(np.float32)
    return cfg, out


def build_eagle(w: EagleWeights, spec: GraphSpec, out_path: Path) -> Path:
    """Write the drafter graph ``out_path`` (+ external data; the embedding in its own shareable file)."""
    from onnx import TensorProto, helper

    g = GraphWriter(out_path)
    seqlens, total = prologue(g, spec)
    eps = float(spec.rms_eps)
    lvl = spec.accuracy_level
    e = _embedding(g, Decoder(embed=w.embed, layers=[], final_norm=w.final_norm, lm_head=w.lm_head))
    if spec.embed_scale is not None:
        e = g.node("Mul", [e, g.init("embed_scale", np.array(spec.embed_scale, dtype=np.float32))], "/embed/Scale")[0]
    th = g.node("Cast", ["target_hidden"], "/fc/Cast", to=1)[0]
    h = g.node("Add", [graph_linear.linear(g, th, w.fc, "/fc", lvl), "prev_hidden"], "/fc/Add")[0]

    def norm(x: str, weight: np.ndarray, name: str) -> str:
        return g.node("SimplifiedLayerNormalization", [x, g.init(f"{name}.weight", weight.astype(np.float32))],
                      f"/{name}", epsilon=eps, axis=-1, stash_type=1)[0]

    x = g.node("Concat", [norm(e, w.layer.attn_norm, "midlayer.input_layernorm"),
                          norm(h, w.hidden_norm, "midlayer.hidden_norm")], "/midlayer/Concat", axis=-1)[0]
    a = _attention(g, x, 0, w.layer, spec, seqlens, total)
    w_post = g.init("midlayer.post_attention_layernorm.weight", w.layer.ffn_norm.astype(np.float32))
    x, _, _, r = g.node("SkipSimplifiedLayerNormalization", [h, a, w_post], "/midlayer/post_attention_layernorm",
                        n_out=4, domain="com.microsoft", epsilon=eps)
    m = _mlp(g, x, 0, w.layer, spec)
    w_f = g.init("norm.weight", w.final_norm.astype(np.float32))
    x, _, _, out = g.node("SkipSimplifiedLayerNormalization", [r, m, w_f], "/norm", n_out=4,
                          domain="com.microsoft", epsilon=eps)
    g.node("Identity", [out], "/hidden_out", outputs=["hidden_out"])
    graph_linear.lm_head(g, x, w.lm_head, w.lm_head is w.embed, lvl)
    vocab = w.lm_head.n if hasattr(w.lm_head, "n") else int(np.asarray(w.lm_head).shape[0])
    seq = ["batch_size", "sequence_length"]
    f32 = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("target_hidden", TensorProto.FLOAT16, [*seq, w.feature_dim]),
           helper.make_tensor_value_info("prev_hidden", f32, [*seq, spec.hidden])]
    outs = [helper.make_tensor_value_info("hidden_out", f32, [*seq, spec.hidden])]
    return save_graph(g, 1, int(vocab), out_path, kv_layout(spec), extra_inputs=ins, extra_outputs=outs,
                      name="edge_spec_eagle3")


def eagle_source(name: str, target: Any) -> Any:
    """An EAGLE-3 head directory (``edge-spec distill --kind eagle3`` or a published one) as a build Source.

    The head reads the target's embedding and hidden states, so the target must be the GGUF it belongs to
    (same hidden size and vocabulary; an edge-spec head also names the file's sha256)."""
    from edge_spec.distill.eagle import Eagle3Config
    from edge_spec.export import own_build

    path = Path(name).expanduser()
    if target is None or getattr(target, "kind", None) != "gguf":
        raise ExportError(f"The drafter '{name}' is an EAGLE-3 head, which reads the target's hidden states; this "
                          "version builds such targets from GGUF files only: pass the target as a .gguf file.")
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    t = target.config
    cfg = Eagle3Config.from_hf(raw, int(t["num_hidden_layers"]), where=f"The drafter '{name}'")
    meta = raw.get(own_build.DRAFTER_KEY) or {}
    want = meta.get("target_sha256")
    if want and want != target.sha256:
        raise ExportError(f"The EAGLE-3 head '{name}' was trained for a target with sha256 {want[:12]}..., not "
                          f"'{target.name}' ({target.sha256[:12]}...); pass the GGUF it was trained on.")
    for what, head, tgt in (("hidden size", cfg.hidden, t["hidden_size"]),
                            ("target hidden size", cfg.target_hidden, t["hidden_size"]),
                            ("vocabulary", cfg.vocab, t["vocab_size"])):
        if int(head) != int(tgt):
            raise ExportError(f"The EAGLE-3 head '{name}' has {what} {head} but the target '{target.name}' has "
                              f"{tgt}; the head belongs to another model.")
    bad = [j for j in cfg.aux_layers if not 0 <= j <= int(t["num_hidden_layers"])]
    if bad:
        raise ExportError(f"The EAGLE-3 head '{name}' reads layer {bad[0]} but the target has "
                          f"{t['num_hidden_layers']} layers; the head belongs to another model.")
    config = {**raw, "num_hidden_layers": 1, "hidden_size": cfg.hidden, "num_attention_heads": cfg.heads,
              "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab,
              "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta, "eagle_aux_layers": list(cfg.aux_layers),
              "draft_vocab_size": cfg.draft_vocab, "feature_dim": cfg.feature_dim}
    from edge_spec.fetch import checkpoint_sha256

    return own_build.Source(name=name, kind="eagle3", architecture=ARCH, config=config,
                            sha256=checkpoint_sha256(path), gguf=target.gguf, path=path)


def draft_to_target(cfg: dict[str, Any], tensors: dict[str, np.ndarray]) -> np.ndarray:
    """[draft vocab] int64 target id of each draft id (``d2t`` holds target - draft; none: the identity)."""
    vd = int(cfg["draft_vocab_size"])
    if "d2t" not in tensors:
        return np.arange(vd, dtype=np.int64)
    ids = np.arange(vd, dtype=np.int64) + tensors["d2t"].astype(np.int64)
    if len(ids) != vd or ids.min() < 0 or ids.max() >= int(cfg["vocab_size"]) or len(np.unique(ids)) != vd:
        raise ExportError("The EAGLE-3 head's d2t map does not send its draft ids to distinct target ids; the head "
                          "is damaged.")
    return ids


def eagle_weights(src: Any, bits: int | None, block_size: int, policy: Any) -> tuple[EagleWeights, np.ndarray,
                                                                                     list[dict[str, Any]]]:
    """(graph weights quantized to ``bits`` (None: float32), draft->target ids, manifest tensor report)."""
    from edge_spec.export import gguf_quant, own_build

    report: list[dict[str, Any]] = []
    embed, _ = own_build._head_and_embedding(src.gguf, [], None, policy)
    report.append(own_build._entry("token_embd.weight (the target's)", embed, "target", "shared"))
    _, sd = read_head_numpy(src.path)
    cfg = src.config

    def lin(name: str) -> Any:
        if name not in sd:
            raise ExportError(f"The EAGLE-3 head '{src.name}' lacks the tensor {name}; it is not a complete head.")
        w = np.asarray(sd[name], dtype=np.float32)
        q = w if bits is None else gguf_quant.quantize_float(w, bits, block_size)
        report.append(own_build._entry(name, q, "F16", "MatMulNBits" if bits else "MatMul"))
        report[-1]["exact"] = bits is None
        return q

    def vec(name: str) -> np.ndarray:
        if name not in sd:
            raise ExportError(f"The EAGLE-3 head '{src.name}' lacks the tensor {name}; it is not a complete head.")
        return np.asarray(sd[name], dtype=np.float32)

    m = "midlayer."
    fc = lin("fc.weight")
    if (fc.k if hasattr(fc, "k") else fc.shape[1]) != int(cfg["feature_dim"]):
        raise ExportError(f"The EAGLE-3 head '{src.name}' has an fc of the wrong width for its "
                          f"{len(cfg['eagle_aux_layers'])} aux layers; the head is inconsistent.")
    layer = Layer(q=lin(m + "self_attn.q_proj.weight"), k=lin(m + "self_attn.k_proj.weight"),
                  v=lin(m + "self_attn.v_proj.weight"), o=lin(m + "self_attn.o_proj.weight"),
                  gate=lin(m + "mlp.gate_proj.weight"), up=lin(m + "mlp.up_proj.weight"),
                  down=lin(m + "mlp.down_proj.weight"), attn_norm=vec(m + "input_layernorm.weight"),
                  ffn_norm=vec(m + "post_attention_layernorm.weight"))
    head = lin("lm_head.weight")
    w = EagleWeights(fc=fc, layer=layer, hidden_norm=vec(m + "hidden_norm.weight"), final_norm=vec("norm.weight"),
                     lm_head=head, embed=embed, feature_dim=int(cfg["feature_dim"]))
    return w, draft_to_target(cfg, sd), report


def llama3_rope_factors(cfg: dict[str, Any]) -> tuple[float, ...] | None:
    """Per-frequency divisors of a ``rope_scaling: {rope_type: llama3}`` config (transformers'
    ``_compute_llama3_parameters``): published heads for Llama 3.1 targets carry it. None for other configs."""
    rs = cfg.get("rope_scaling") or {}
    if (rs.get("rope_type") or rs.get("type")) != "llama3":
        return None
    theta = float(cfg.get("rope_theta", 10000.0))
    d = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    factor = float(rs["factor"])
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    old = float(rs.get("original_max_position_embeddings", 8192))
    wavelen = 2 * np.pi / inv
    smooth = np.clip((old / wavelen - low) / (high - low), 0.0, 1.0)
    new = np.where(wavelen < old / high, inv, np.where(wavelen > old / low, inv / factor,
                                                         (1 - smooth) * inv / factor + smooth * inv))
    return tuple(float(x) for x in inv / new)


def build_eagle_role(src: Any, out_dir: Path, max_context: int, accuracy_level: int, bits: int | None,
                     block_size: int, mode: str, kv_dtype: str) -> tuple[Path, np.ndarray]:
    """Write ``out_dir/model.onnx`` for an EAGLE-3 head; returns (graph, draft->target ids). Fills ``src.report``."""
    import dataclasses

    from edge_spec.export import own_build

    w, ids, src.report = eagle_weights(src, bits, block_size, own_build.Policy(mode, accuracy_level))
    # the head's own attention sizes and rope (its config's base and llama3 scaling, as vLLM runs a published head),
    # the target's embedding scale (Gemma)
    spec = own_build.graph_spec(src.config, max_context, accuracy_level, None)
    spec = dataclasses.replace(spec, kv_dtype=kv_dtype, local_layers=None, rope_factors=llama3_rope_factors(src.config),
                               embed_scale=own_build.graph_spec(src.gguf.config, max_context, accuracy_level,
                                                                src.gguf).embed_scale)
    return build_eagle(w, spec, out_dir / "model.onnx"), ids
