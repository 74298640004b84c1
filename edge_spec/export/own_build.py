"""Sources edge-spec builds its own graphs for (GGUF files, edge-spec distilled drafters) -> decoder graphs.

* A **GGUF** file keeps its own quantization: every linear weight goes through
  :func:`gguf_quant.from_gguf` into MatMulNBits as is; a tied Q8_0-style embedding is gathered from the
  LM head's own 8-bit blocks (one initializer, dequantized in the graph exactly as GGML does).
* An **edge-spec distilled drafter** (config.json with ``edge_spec_drafter`` + model.safetensors without
  embedding and LM head) takes the target GGUF's embedding and LM head tensors unchanged and quantizes its
  own (HF layout) layers with :func:`gguf_quant.quantize_float`.

Each build returns a per-tensor report (what was exact) for the manifest and the export log.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_spec.errors import ExportError
from edge_spec.export import arch_graph, gguf_kquant, gguf_quant, gguf_split
from edge_spec.export import gguf as gguf_src
from edge_spec.export.onnx_graph import (
    OWN_ATTENTION,
    Decoder,
    GraphSpec,
    Layer,
    LazyLayers,
    build_decoder,
    own_attention_fits,
)
from edge_spec.export.weights import is_kquant, is_quant, is_split, take_rows, unpermute_qk
from edge_spec.fetch import checkpoint_sha256, file_sha256

DRAFTER_KEY = "edge_spec_drafter"
_QK_HEADS = {"q": "num_attention_heads", "k": "num_key_value_heads"}


@dataclass
class Source:
    """A model our own builder turns into a graph."""

    name: str
    kind: str  # "gguf" | "distilled"
    architecture: str  # HF architecture name
    config: dict[str, Any]
    sha256: str
    gguf: gguf_src.GGUFModel | None = None  # the file itself (kind "gguf") or the target it shares with
    path: Path | None = None  # distilled drafter directory
    report: list[dict[str, Any]] = field(default_factory=list)


def is_distilled_dir(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        return DRAFTER_KEY in json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def gguf_source(name: str, role: str) -> Source:
    m = gguf_src.read_gguf(name, role)
    return Source(name=name, kind="gguf", architecture=m.architecture, config=m.config,
                  sha256=file_sha256(m.path), gguf=m)


def distilled_source(name: str, target: Source | None) -> Source:
    """An edge-spec distilled drafter dir; it must name the target GGUF it shares its embedding with."""
    path = Path(name).expanduser()
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    meta = cfg.get(DRAFTER_KEY) or {}
    if target is None or target.kind != "gguf":
        raise ExportError(f"The drafter '{name}' is an edge-spec distilled drafter that shares the target's "
                          "embedding, so the target must be the GGUF file it was distilled from.")
    want = meta.get("target_sha256")
    if want and want != target.sha256:
        raise ExportError(f"The drafter '{name}' was distilled from a target with sha256 {want[:12]}..., not "
                          f"'{target.name}' ({target.sha256[:12]}...); pass the GGUF it was distilled from.")
    if not (path / "model.safetensors").is_file():
        raise ExportError(f"The drafter directory '{name}' has no model.safetensors; pass a complete edge-spec "
                          "drafter directory.")
    if int(cfg.get("hidden_size", -1)) != target.config["hidden_size"]:
        raise ExportError(f"The drafter '{name}' has hidden size {cfg.get('hidden_size')} but the target has "
                          f"{target.config['hidden_size']}; a drafter sharing the target's embedding needs the same.")
    cfg = {**cfg, "vocab_size": target.config["vocab_size"]}
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    return Source(name=name, kind="distilled", architecture=arch, config=cfg, sha256=checkpoint_sha256(path),
                  gguf=target.gguf, path=path)


def weight_bytes(w: Any) -> int:
    if is_kquant(w):
        return int(w.data.nbytes)
    if is_split(w):
        return weight_bytes(w.base) + int(w.offsets.nbytes)
    if is_quant(w):
        return int(w.packed.nbytes + w.scales.nbytes + (0 if w.zero_points is None else w.zero_points.nbytes))
    return int(np.asarray(w).nbytes)


def _entry(name: str, w: Any, gguf_type: str, op: str) -> dict[str, Any]:
    """One manifest ``tensors`` row: source type, operator, bits/block, exact, max |graph - source|."""
    if is_quant(w) or is_split(w) or is_kquant(w):
        return {"name": name, "gguf_type": gguf_type, "onnx_op": op, "bits": int(w.bits),
                "block": int(w.block_size), "exact": bool(w.exact), "max_abs_err": float(w.max_abs_err),
                "bytes": weight_bytes(w)}
    return {"name": name, "gguf_type": gguf_type, "onnx_op": op, "bits": 32, "block": None, "exact": True,
            "max_abs_err": 0.0, "bytes": weight_bytes(w)}


MODES = ("exact", "split", "fast", "compact", "kquant")
SPLIT_OP = "MatMulNBits+blocksum"  # manifest onnx_op of a SplitWeight


@dataclass(frozen=True)
class Policy:
    """How GGUF tensors become graph weights (docs/export.md, "GGUF in").

    exact: every weight equals the file's; what ONNX Runtime can only run through its slow fallbacks (float
    zero points, 8 bits below accuracy_level 4) becomes an fp32 MatMul of the exact values instead.
    split: float-offset types (Q4_1, Q4_K, Q2_K, Q5_1, Q5_K) as W = D + M: MatMulNBits with integer zero points
    for D = d*q plus a MatMul of the per-block sums of x with the block offsets M (both exact, fast kernels);
    otherwise as exact.
    fast: Q4_1/Q4_K/Q2_K as 8-bit integer zero points (not exact, error <= s/32); run it at accuracy_level 4.
    compact: MatMulNBits everywhere, float zero points included (smallest; slow fallbacks on CPU).
    kquant: Q4_K / Q6_K tensors (and Q8_0 / Q5_0 / Q4_1 layer weights of N a multiple of 8) keep the file's bytes and
    run on edge-spec's own kernels (GgufMatMul / GgufGather, export/gguf_kquant.py; the runtime needs the
    compiled library); other types as split."""

    mode: str = "exact"
    accuracy_level: int = 1


def _convert(t: Any, policy: Policy, head: bool = False) -> tuple[Any, str]:
    """A GGUF linear tensor [N, K] -> (graph weight, operator name); ``head``: the LM head (VocabTrim may take
    its rows)."""
    if policy.mode == "kquant":
        if gguf_kquant.supports(t.tensor_type.name, None if head else int(t.data.shape[0])):
            return gguf_kquant.from_gguf(t), "GgufMatMul"
        policy = dataclasses.replace(policy, mode="split")
    if policy.mode == "split":
        w = gguf_split.split_from_gguf(t)
    else:
        w = gguf_quant.from_gguf(t, float_zero_points=policy.mode != "fast")
    if is_split(w) and w.exact and not (w.bits == 8 and policy.accuracy_level < 4):
        return w, SPLIT_OP
    if not is_quant(w) and not is_split(w):
        return w, "MatMul"
    float_zp = is_quant(w) and w.zero_points is not None and w.zero_points.dtype == np.float32
    slow = float_zp or (w.bits == 8 and policy.accuracy_level < 4)
    if is_split(w) or (policy.mode in ("exact", "split") and (slow or not w.exact)):
        import gguf  # a SplitWeight here is 8 bits below level 4 (slow kernel) or inexact: exact mode's fallback

        ref = np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
        return ref.reshape(w.n, w.k), "MatMul (fp32 of the exact values)"
    return w, "MatMulNBits"


def _gguf_linear(m: gguf_src.GGUFModel, name: str, report: list, qk: str | None, policy: Policy) -> Any:
    t = m.tensors[name]
    w, op = _convert(t, policy)
    gguf_src.release(t)
    if qk and m.permuted_qk:  # un-permute rows: exact, blocks run along K
        w = unpermute_qk(w, int(m.config[_QK_HEADS[qk]]))
    report.append(_entry(name, w, t.tensor_type.name, op))
    return w


def _f32(m: gguf_src.GGUFModel, name: str) -> np.ndarray:
    t = m.tensors[name]
    return np.asarray(gguf_quant.from_gguf(t), dtype=np.float32).reshape(-1)


def _head_and_embedding(m: gguf_src.GGUFModel, report: list, kept: np.ndarray | None, policy: Policy
                        ) -> tuple[Any, Any]:
    """(embed, lm_head) from the GGUF: the head keeps its blocks; a tied 8-bit symmetric head is also the
    embedding (one initializer); otherwise the embedding keeps its blocks too (GatherBlockQuantized for integer
    offsets, a Gather + decode subgraph for float offsets such as Q4_K's), float32 only for float types."""
    emb_t = m.tensors["token_embd.weight"]
    head_name = "output.weight" if "output.weight" in m.tensors else "token_embd.weight"
    head_t = m.tensors[head_name]
    head, h_op = _convert(head_t, policy, head=True)
    tied = head_name == "token_embd.weight"
    embed: Any
    if tied and is_kquant(head):
        embed, op = head, "GgufGather (shares the LM head's blocks)"
    elif policy.mode == "kquant" and gguf_kquant.supports(emb_t.tensor_type.name):
        embed, op = gguf_kquant.from_gguf(emb_t), "GgufGather"
    elif tied and is_quant(head) and head.bits == 8 and head.zero_points is None and head.exact:
        embed, op = head, "Gather+dequant (shares the LM head's blocks)"
    else:
        g = gguf_quant.gather_from_gguf(emb_t)
        if hasattr(g, "op") and g.op == "GatherBlockQuantized":
            embed, op = g, "GatherBlockQuantized"
        elif hasattr(g, "op") and g.exact:  # float-offset types: the file's codes, fp32(q * s) - t in the graph
            embed, op = g, "Gather+decode (the file's codes and offsets)"
        else:  # float types, or (never seen) offsets that would not come out exact: float32 values
            embed = g if isinstance(g, np.ndarray) else gguf_quant.dequantize(g)
            op = "Gather (float32)"
            if hasattr(g, "exact") and not g.exact:
                raise ExportError(f"The GGUF embedding type {emb_t.tensor_type.name} cannot be carried over exactly; "
                                  "this should not happen, please report it.")
    gguf_src.release(emb_t)
    gguf_src.release(head_t)
    report.append(_entry("token_embd.weight", embed, emb_t.tensor_type.name, op))
    full_bytes = weight_bytes(head)
    if kept is not None:
        head, h_op = take_rows(head, kept), f"{h_op} (VocabTrim rows)"
    report.append({**_entry(f"{head_name} (LM head)", head, head_t.tensor_type.name, h_op),
                   "bytes_untrimmed": full_bytes})
    return embed, head


def _qkv(m: gguf_src.GGUFModel, b: str, report: list, pol: Policy) -> tuple[Any, Any, Any]:
    """q, k, v [rows, hidden] of block ``b``: three tensors, or Phi-3's fused attn_qkv cut by rows (exact)."""
    if b + "attn_qkv.weight" not in m.tensors:
        return (_gguf_linear(m, b + "attn_q.weight", report, "q", pol),
                _gguf_linear(m, b + "attn_k.weight", report, "k", pol),
                _gguf_linear(m, b + "attn_v.weight", report, None, pol))
    qkv = _gguf_linear(m, b + "attn_qkv.weight", report, None, pol)
    c = m.config
    nq, nk = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return tuple(take_rows(qkv, np.arange(lo, hi)) for lo, hi in ((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk)))


def _gate_up(m: gguf_src.GGUFModel, b: str, report: list, pol: Policy) -> tuple[Any, Any]:
    """gate, up [ffn, hidden] of block ``b``; Phi-3 has no ffn_gate: its ffn_up holds gate then up rows."""
    if b + "ffn_gate.weight" in m.tensors:
        return (_gguf_linear(m, b + "ffn_gate.weight", report, None, pol),
                _gguf_linear(m, b + "ffn_up.weight", report, None, pol))
    gu = _gguf_linear(m, b + "ffn_up.weight", report, None, pol)
    ff = int(m.config["intermediate_size"])
    return take_rows(gu, np.arange(ff)), take_rows(gu, np.arange(ff, 2 * ff))


def gguf_decoder(m: gguf_src.GGUFModel, layers: int | None = None, kept: np.ndarray | None = None,
                 policy: Policy | None = None) -> tuple[Decoder, list[dict[str, Any]]]:
    """GGUF tensors -> :class:`Decoder` (first ``layers`` layers when given; LM head rows ``kept``).

    ``policy`` (default: exact at accuracy_level 1) decides the encoding, see :class:`Policy`. The layers are
    converted when the graph writer iterates them (``report`` grows then), so only one is in memory at a time."""
    report: list[dict[str, Any]] = []
    n_layers = int(m.config["num_hidden_layers"]) if layers is None else layers
    pol = policy or Policy()
    embed, head = _head_and_embedding(m, report, kept, pol)

    def layer(i: int) -> Layer:
        b = f"blk.{i}."
        try:
            q, k, v = _qkv(m, b, report, pol)
            gate, up = _gate_up(m, b, report, pol)
            L = Layer(q=q, k=k, v=v, o=_gguf_linear(m, b + "attn_output.weight", report, None, pol),
                      gate=gate, up=up, down=_gguf_linear(m, b + "ffn_down.weight", report, None, pol),
                      attn_norm=_f32(m, b + "attn_norm.weight"), ffn_norm=_f32(m, b + "ffn_norm.weight"))
            if m.gguf_arch in gguf_src.GEMMA:  # GGUF Gemma norms hold 1 + w already: the graph's RMSNorm weight
                L.post_attn_norm = _f32(m, b + "post_attention_norm.weight")
                L.post_ffn_norm = _f32(m, b + "post_ffw_norm.weight")
        except KeyError as exc:
            raise ExportError(f"The GGUF '{m.name}' has no tensor {exc.args[0]}; the file is incomplete or not a "
                              f"plain {m.gguf_arch} decoder.") from None
        if m.qkv_bias:
            for nm in ("q", "k", "v"):
                key = f"{b}attn_{nm}.bias"
                if key in m.tensors:
                    setattr(L, f"{nm}_bias", _f32(m, key))
        if m.qk_norm:
            L.q_norm, L.k_norm = _f32(m, b + "attn_q_norm.weight"), _f32(m, b + "attn_k_norm.weight")
        return L

    layers_ = LazyLayers(n_layers, layer)  # converted one at a time as the graph writer reaches them
    return Decoder(embed=embed, layers=layers_, final_norm=_f32(m, "output_norm.weight"), lm_head=head), report


def distilled_decoder(src: Source, bits: int | None, block_size: int, kept: np.ndarray | None = None,
                      policy: Policy | None = None) -> tuple[Decoder, list[dict[str, Any]]]:
    """An edge-spec drafter: its own layers quantized by us (``bits`` None = float32), embedding + head from
    the target GGUF unchanged."""
    from safetensors.numpy import load_file

    report: list[dict[str, Any]] = []
    embed, head = _head_and_embedding(src.gguf, report, kept, policy or Policy())
    sd = load_file(str(src.path / "model.safetensors"))

    def lin(name: str) -> Any:
        try:
            w = np.asarray(sd[name], dtype=np.float32)
        except KeyError:
            raise ExportError(f"The drafter '{src.name}' has no tensor {name} in model.safetensors; re-save it "
                              "with edge-spec distill.") from None
        src_type = str(sd[name].dtype).upper().replace("FLOAT", "F")
        q = w if bits is None else gguf_quant.quantize_float(w, bits, block_size)
        report.append(_entry(name, q, src_type, "MatMulNBits" if bits else "MatMul"))
        if bits is not None:  # re-quantized by us: exact only if the float weights were already on the grid
            report[-1]["exact"] = False
        return q

    def vec(name: str) -> np.ndarray | None:
        return np.asarray(sd[name], dtype=np.float32) if name in sd else None

    cfg = src.config
    layers = [arch_graph.distilled_layer(f"model.layers.{i}.", cfg, lin, sd.__contains__, vec)
              for i in range(int(cfg["num_hidden_layers"]))]
    final = vec("model.norm.weight")  # Gemma's RMSNorm multiplies by 1 + w
    final = final + np.float32(1.0) if arch_graph.is_gemma(cfg) and final is not None else final
    return Decoder(embed=embed, layers=layers, final_norm=final, lm_head=head), report


def graph_spec(cfg: dict[str, Any], max_context: int, accuracy_level: int, m: gguf_src.GGUFModel | None
               ) -> GraphSpec:
    factors = None
    if m is not None and "rope_freqs.weight" in m.tensors:  # Llama 3 style frequency factors
        factors = tuple(float(x) for x in _f32(m, "rope_freqs.weight"))
    scaling = cfg.get("rope_scaling") or {}
    kw: dict[str, Any] = dict(
        rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        rope_linear=float(scaling.get("factor", 1.0)) if scaling.get("rope_type") == "linear" else 1.0)
    kw.update(arch_graph.graph_fields(cfg))  # Gemma 2/3: embedding scale, soft caps, local layers, rope bases
    return GraphSpec(hidden=int(cfg["hidden_size"]), heads=int(cfg["num_attention_heads"]),
                     kv_heads=int(cfg["num_key_value_heads"]), head_dim=int(cfg["head_dim"]),
                     rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), max_context=max_context,
                     accuracy_level=accuracy_level, rope_factors=factors, **kw)


def build(src: Source, out_dir: Path, max_context: int, accuracy_level: int, bits: int | None = 4,
          block_size: int = 32, kept: np.ndarray | None = None, layers: int | None = None,
          mode: str = "exact", kv_dtype: str = "float32", features: tuple[int, ...] | None = None) -> Path:
    """Write ``out_dir/model.onnx`` (+ data) for ``src``; fills ``src.report``. ``bits`` applies to distilled
    drafters only (GGUF tensors keep their own); ``mode`` to GGUF files (:class:`Policy`)."""
    if src.kind == "gguf":
        dec, report = gguf_decoder(src.gguf, layers, kept, Policy(mode, accuracy_level))
    else:
        dec, report = distilled_decoder(src, bits, block_size, kept, Policy(mode, accuracy_level))
    src.report = report
    spec = dataclasses.replace(graph_spec(src.config, max_context, accuracy_level, src.gguf), kv_dtype=kv_dtype,
                               feature_layers=features)
    if src.kind == "gguf" and mode == "kquant" and _on_kernels(src.gguf) and own_attention_fits(spec):
        # the graph needs the kernel library anyway: its attention too (no padding row, no fp16 casts)
        spec = dataclasses.replace(spec, attention=OWN_ATTENTION)
    return build_decoder(dec, spec, out_dir / "model.onnx")


def _on_kernels(m: gguf_src.GGUFModel) -> bool:
    """Does a kquant-mode graph of this file run any tensor on the kernel library (GgufMatMul / GgufGather)?"""
    heads = ("output.weight", "token_embd.weight")
    return any(gguf_kquant.supports(t.tensor_type.name, None if name in heads else int(t.data.shape[0]))
               for name, t in m.tensors.items() if name.endswith(".weight") and len(t.data.shape) == 2)


def precision_of(report: list[dict[str, Any]]) -> tuple[str, int | None]:
    """The manifest's precision / block size for a mixed graph: the most common bits of its linear weights."""
    bits = Counter(e["bits"] for e in report if "LM head" not in e["name"] and e["name"] != "token_embd.weight")
    blocks = Counter(e["block"] for e in report if e["block"])
    top = bits.most_common(1)[0][0] if bits else 32
    return {4: "int4", 8: "int8"}.get(top, "fp32"), (blocks.most_common(1)[0][0] if blocks else None)


def write_genai_config(out_dir: Path, cfg: dict[str, Any], max_context: int) -> None:
    """A minimal ORT GenAI config next to the graph (benchmarks drive GGUF graphs with ORT GenAI too)."""
    dec = {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": "model.onnx",
           "head_size": int(cfg["head_dim"]), "hidden_size": int(cfg["hidden_size"]),
           "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                      "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
           "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                       "present_value_names": "present.%d.value"},
           "num_attention_heads": int(cfg["num_attention_heads"]), "num_hidden_layers": int(cfg["num_hidden_layers"]),
           "num_key_value_heads": int(cfg["num_key_value_heads"])}
    eos = cfg.get("eos_token_id", 0)
    body = {"model": {"bos_token_id": cfg.get("bos_token_id", 0), "context_length": max_context, "decoder": dec,
                      "eos_token_id": eos, "pad_token_id": eos if isinstance(eos, int) else eos[0],
                      "type": cfg.get("model_type", "llama"), "vocab_size": int(cfg["vocab_size"])},
            "search": {"do_sample": False, "max_length": max_context, "num_beams": 1,
                       "past_present_share_buffer": True}}
    (out_dir / "genai_config.json").write_text(json.dumps(body, indent=4) + "\n", encoding="utf-8")


def head_bytes(src: Source) -> tuple[int, int]:
    """LM-head bytes (before, after VocabTrim) from the last build's report."""
    head = next(e for e in src.report if e["name"].endswith("(LM head)"))
    return int(head["bytes_untrimmed"]), int(head["bytes"])
