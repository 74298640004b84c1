"""What Phi-3 and Gemma 2/3 add to our own decoder graph, for both sources :mod:`own_build` reads.

* ``graph_fields``: the :class:`onnx_graph.GraphSpec` fields of a Gemma config — either the HF-style config
  :mod:`gguf` derives from a GGUF file (llama.cpp's reading of it: ``rope_theta`` + ``rope_local_base_freq``)
  or the transformers config an edge-spec distilled drafter carries (transformers 5: per-layer-type
  ``rope_parameters``).
* ``distilled_layer``: one layer of an edge-spec distilled drafter in HF layout (Llama / Qwen / Phi-3 fused
  ``qkv_proj`` and ``gate_up_proj`` / Gemma's four norms, stored as w where the graph needs 1 + w).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edge_spec.export.onnx_graph import Layer
from edge_spec.export.weights import take_rows

GEMMA_TYPES = ("gemma2", "gemma3", "gemma3_text")  # HF model_type (a GGUF-derived config says "gemma3")


def is_gemma(cfg: dict[str, Any]) -> bool:
    return str(cfg.get("model_type", "")) in GEMMA_TYPES


def graph_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """GraphSpec keyword arguments for a Gemma config ({} for any other): embedding scale sqrt(hidden), attention
    scale query_pre_attn_scalar^-1/2, soft caps, GELU-tanh, local layers + window, rope bases (global / local)."""
    if not is_gemma(cfg):
        return {}
    types = cfg.get("layer_types") or []
    local = cfg.get("rope_local_base_freq")
    out: dict[str, Any] = {}
    rope = cfg.get("rope_parameters") or {}
    if "full_attention" in rope:  # transformers 5 Gemma 3: one rope per layer type
        full, slide = rope["full_attention"] or {}, rope.get("sliding_attention") or {}
        out["rope_theta"] = float(full.get("rope_theta", 1_000_000.0))
        local = slide.get("rope_theta", 10_000.0)
        if full.get("rope_type") == "linear":
            out["rope_linear"] = float(full.get("factor", 1.0))
    out.update(embed_scale=float(np.sqrt(np.float32(cfg["hidden_size"]))),
               attn_scale=float(cfg.get("query_pre_attn_scalar") or cfg["head_dim"]) ** -0.5,
               attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
               final_softcap=float(cfg.get("final_logit_softcapping") or 0.0), activation="gelu_tanh",
               local_layers=tuple(t == "sliding_attention" for t in types) or None,
               sliding_window=int(cfg.get("sliding_window") or -1),
               local_rope_theta=None if local is None else float(local))
    return out


def distilled_layer(p: str, cfg: dict[str, Any], lin: Callable[[str], Any], has: Callable[[str], bool],
                    vec: Callable[[str], np.ndarray | None]) -> Layer:
    """Layer ``p`` ("model.layers.N.") of an HF-layout drafter. ``lin(name)`` gives a graph weight [N, K],
    ``has(name)`` whether the checkpoint holds a tensor, ``vec(name)`` a float vector or None."""
    gemma = is_gemma(cfg)

    def norm(name: str) -> np.ndarray | None:  # Gemma's RMSNorm multiplies by 1 + w, in fp32 as transformers
        v = vec(name)
        return None if v is None else (v + np.float32(1.0) if gemma else v)

    a, m = p + "self_attn.", p + "mlp."
    if has(a + "qkv_proj.weight"):  # Phi-3: q | k | v rows in one tensor; rows are independent, so cutting is exact
        qkv = lin(a + "qkv_proj.weight")
        nq, nk = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
        q, k, v = (take_rows(qkv, np.arange(lo, hi)) for lo, hi in ((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk)))
    else:
        q, k, v = lin(a + "q_proj.weight"), lin(a + "k_proj.weight"), lin(a + "v_proj.weight")
    if has(m + "gate_up_proj.weight"):  # Phi-3: gate rows, then up rows
        gu, ff = lin(m + "gate_up_proj.weight"), int(cfg["intermediate_size"])
        gate, up = take_rows(gu, np.arange(ff)), take_rows(gu, np.arange(ff, 2 * ff))
    else:
        gate, up = lin(m + "gate_proj.weight"), lin(m + "up_proj.weight")
    post = p + "post_attention_layernorm.weight"  # Gemma: the attention output's norm; others: the MLP input's
    L = Layer(q=q, k=k, v=v, o=lin(a + "o_proj.weight"), gate=gate, up=up, down=lin(m + "down_proj.weight"),
              attn_norm=norm(p + "input_layernorm.weight"),
              ffn_norm=norm(p + "pre_feedforward_layernorm.weight" if gemma else post),
              q_bias=vec(a + "q_proj.bias"), k_bias=vec(a + "k_proj.bias"), v_bias=vec(a + "v_proj.bias"),
              q_norm=norm(a + "q_norm.weight"), k_norm=norm(a + "k_norm.weight"))
    if gemma:
        L.post_attn_norm, L.post_ffn_norm = norm(post), norm(p + "post_feedforward_layernorm.weight")
    return L
