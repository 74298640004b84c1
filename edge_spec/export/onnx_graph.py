"""Our own ONNX decoder graph, built from weights that are already quantized (or float).

The graph has exactly the interface of the ORT GenAI builder graphs the runtime drives
(``input_ids`` [1, k] int64, ``attention_mask`` [1, n + k] int64, ``past_key_values.%d.key/.value``
[1, kv_heads, max_len, head] fp32 bound to ``present.%d.*`` as one buffer, ``logits`` [1, k, vocab]
fp32) and the same fused operators (com.microsoft, ONNX Runtime CPU): SimplifiedLayerNormalization /
SkipSimplifiedLayerNormalization, MatMulNBits, GroupQueryAttention with rotary embedding.

Weights come in as ``gguf_quant.QuantWeight`` (MatMulNBits layout, taken over as is, so the graph
dequantizes to exactly the source's values) or as float arrays ``[N, K]`` (HF ``[out, in]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_spec.export import gguf_quant, graph_linear
from edge_spec.export.graph_writer import CUSTOM_DOMAIN, LOGITS_TO_KEEP, GraphWriter, KVLayout, save_graph
from edge_spec.export.weights import Weight, concat_rows, is_kquant, is_quant, is_split, n_rows


@dataclass
class Layer:
    """One decoder layer. Linear weights are [N out, K in]; norms are [hidden] (q/k norms [head])."""

    q: Weight
    k: Weight
    v: Weight
    o: Weight
    gate: Weight
    up: Weight
    down: Weight
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None  # Gemma 2/3 "sandwich" norms on the attention / MLP outputs
    post_ffn_norm: np.ndarray | None = None


@dataclass
class Decoder:
    """``embed`` [vocab, hidden] (an 8-bit symmetric QuantWeight is gathered and dequantized in the graph;
    when ``lm_head is embed`` the head reads the same initializer), ``lm_head`` [vocab_out, hidden]; ``layers`` a
    list, or a :class:`LazyLayers` that makes each layer when the writer reaches it."""

    embed: Weight
    layers: Sequence[Layer]
    final_norm: np.ndarray
    lm_head: Weight


class LazyLayers(Sequence):
    """``n`` layers made by ``make(i)`` each time they are read (never kept): :func:`build_decoder` reads each once,
    so a model's converted weights are in memory one layer at a time."""

    def __init__(self, n: int, make: Callable[[int], Layer]) -> None:
        self._n, self._make = n, make

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Layer:  # type: ignore[override]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._make(i % self._n)


@dataclass(frozen=True)
class GraphSpec:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_context: int  # positions of the cos/sin caches (>= the KV buffer's length)
    accuracy_level: int = 4
    rope_factors: tuple[float, ...] | None = None  # per-frequency divisors (GGUF rope_freqs, Llama 3)
    rope_linear: float = 1.0  # linear rope scaling factor
    # Gemma 2/3 (defaults leave the llama / qwen graph unchanged):
    embed_scale: float | None = None  # embedding rows times this (sqrt(hidden)), in fp32
    attn_scale: float | None = None  # q.k scale; None = 1 / sqrt(head_dim)
    attn_softcap: float = 0.0  # GroupQueryAttention softcap: cap * tanh(scores / cap)
    final_softcap: float = 0.0  # logits = cap * tanh(logits / cap)
    activation: str = "silu"  # gated MLP activation: "silu" | "gelu_tanh"
    local_layers: tuple[bool, ...] | None = None  # per layer: sliding-window attention
    sliding_window: int = -1  # keys a query sees in a local layer, itself included (HF ``sliding_window``)
    local_rope_theta: float | None = None  # local layers' own rope base (Gemma 3), unscaled; None = the global caches
    kv_dtype: str = "float32"  # "float16": KV cache in fp16 (GroupQueryAttention: q/k/v cast to fp16 around it)
    # "GroupQueryAttention" (ONNX Runtime's) or "CacheAttention" (edge-spec's kernel library, kernels/kquant/
    # attention.cpp: fp32 q/k/v, each row computed alone, so a 1-token pass needs no padding row); graphs that run
    # on the library's K-quant kernels anyway take the second (own_build.build)
    attention: str = "GroupQueryAttention"
    # Residual streams to output as ``hidden_states`` [1, S, len * hidden] float16, for a drafter that reads the
    # target (EAGLE-3): id j = the input of layer j (0 = the embeddings, L = the last layer's output, pre-norm)
    feature_layers: tuple[int, ...] | None = None


OWN_ATTENTION = "CacheAttention"  # GraphSpec.attention of the kernel library's op


def own_attention_fits(spec: GraphSpec) -> bool:
    """Can the kernel library's attention op run this graph's heads (head_dim a multiple of 8, at most 512)?"""
    return spec.head_dim % 8 == 0 and spec.head_dim <= 512 and spec.heads % spec.kv_heads == 0


def kv_layout(spec: GraphSpec) -> KVLayout:
    """The KV inputs' element type and shape of ``spec``'s graph."""
    return KVLayout(spec.kv_dtype, spec.kv_heads, spec.head_dim)


def rope_caches(spec: GraphSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [max_context, head_dim / 2], float32, computed like transformers (float32 inv_freq)."""
    d = spec.head_dim
    inv = (1.0 / (np.float32(spec.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))))
    inv = inv.astype(np.float32)
    if spec.rope_factors is not None:
        inv = (inv / np.asarray(spec.rope_factors, dtype=np.float32)).astype(np.float32)
    if spec.rope_linear != 1.0:
        inv = (inv / np.float32(spec.rope_linear)).astype(np.float32)
    t = np.arange(spec.max_context, dtype=np.float32)
    freqs = np.outer(t, inv).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _embedding(g: GraphWriter, dec: Decoder) -> str:
    e = dec.embed
    if is_kquant(e):  # the file's Q4_K / Q6_K rows (a tied LM head reads the same initializer)
        b = g.init("embed.gguf_blocks", e.graph_bytes())
        return g.node("GgufGather", [b, "input_ids"], "/embed/GgufGather", domain=CUSTOM_DOMAIN,
                      ggml_type=e.ggml_type, interleave=e.interleave)[0]
    if getattr(e, "op", None) == "GatherDecode":  # float-offset blocks (Q4_K, Q4_1, ...): fp32(q * s) - t in graph
        inits, nodes = gguf_quant.gather_onnx(e, "embed", "input_ids", "/embed/output_0")
        g.add(inits, nodes)
        return "/embed/output_0"
    if getattr(e, "op", None) == "GatherBlockQuantized":  # gguf_quant.GatherWeight, integer zero points
        ins = ["embed.qdata", "input_ids", "embed.scales"]
        g.init("embed.qdata", e.packed)  # [V, K * bits / 8] uint8
        g.init("embed.scales", e.scales.reshape(e.n, -1))  # [V, nb]
        if e.zero_points is not None:
            ins.append(g.init("embed.zero_points", e.zero_points))
        return g.node("GatherBlockQuantized", ins, "/embed/GatherBlockQuantized", domain="com.microsoft",
                      gather_axis=0, quantize_axis=1, block_size=e.block_size, bits=e.bits)[0]
    if is_quant(e):
        if e.bits != 8 or e.zero_points is not None:
            raise ValueError("the in-graph embedding dequantization handles 8-bit symmetric weights only")
        q = g.init("embed.blocks", e.packed)  # [V, nb, bs] uint8; a tied LM head reads the same tensors
        nb = e.k // e.block_size
        s = g.init("embed.scales", e.scales.reshape(e.n, nb))  # [V, nb]
        rows = g.node("Gather", [q, "input_ids"], "/embed/GatherQ")[0]  # [1, S, nb, bs]
        f = g.node("Cast", [rows], "/embed/Cast", to=1)[0]
        c = g.init("embed.zero_point", np.array(128.0, dtype=np.float32))
        centered = g.node("Sub", [f, c], "/embed/Sub")[0]
        sc = g.node("Gather", [s, "input_ids"], "/embed/GatherS")[0]  # [1, S, nb]
        sc = g.node("Unsqueeze", [sc, g.init("axes_last", np.array([-1], dtype=np.int64))], "/embed/Unsq")[0]
        deq = g.node("Mul", [centered, sc], "/embed/Mul")[0]  # [1, S, nb, bs]: (q - 128) * d, as GGML
        shape = g.init("embed.shape", np.array([0, 0, e.k], dtype=np.int64))
        return g.node("Reshape", [deq, shape], "/embed/Reshape")[0]
    arr = np.asarray(e)
    if arr.dtype == np.float16:  # keep fp16 on disk; the cast to fp32 is exact
        rows = g.node("Gather", [g.init("embed.weight", arr), "input_ids"], "/embed/Gather")[0]
        return g.node("Cast", [rows], "/embed/Cast", to=1)[0]
    return g.node("Gather", [g.init("embed.weight", arr.astype(np.float32)), "input_ids"], "/embed/Gather")[0]


def _head_norm(g: GraphWriter, x: str, w: np.ndarray, heads: int, spec: GraphSpec, name: str) -> str:
    """RMSNorm over each head's vector (Qwen3 q/k norm): [1, S, H*d] -> [1, S, H, d] -> norm -> back."""
    split = g.init(f"{name}.shape4", np.array([0, 0, heads, spec.head_dim], dtype=np.int64))
    flat = g.init(f"{name}.shape3", np.array([0, 0, heads * spec.head_dim], dtype=np.int64))
    x4 = g.node("Reshape", [x, split], f"{name}/Reshape4")[0]
    n = g.node("SimplifiedLayerNormalization", [x4, g.init(f"{name}.weight", w.astype(np.float32))], name,
               epsilon=spec.rms_eps, axis=-1, stash_type=1)[0]
    return g.node("Reshape", [n, flat], f"{name}/Reshape3")[0]


def _window(spec: GraphSpec, i: int) -> int:
    """GroupQueryAttention's local_window_size for layer ``i``: the keys a query sees, itself included (ONNX
    Runtime's CPU kernel), which is HF's ``sliding_window`` and llama.cpp's n_swa; -1 = full attention."""
    if spec.local_layers is None or not spec.local_layers[i] or spec.sliding_window <= 0:
        return -1
    return int(spec.sliding_window)


def _attention(g: GraphWriter, x: str, i: int, L: Layer, spec: GraphSpec, seqlens: str, total: str) -> str:
    p = f"/model/layers.{i}/attn"
    lvl = spec.accuracy_level
    biases = [L.q_bias, L.k_bias, L.v_bias]
    fused = concat_rows([L.q, L.k, L.v]) if L.q_norm is None else None
    if fused is not None:
        qkv = graph_linear.linear(g, x, fused, f"{p}/qkv_proj", lvl)
        if any(b is not None for b in biases):
            dims = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.kv_heads * spec.head_dim)
            bias = np.concatenate([np.zeros(d, np.float32) if b is None else b.astype(np.float32)
                                   for b, d in zip(biases, dims)])
            qkv = g.node("Add", [qkv, g.init(f"{p}/qkv_proj.bias", bias)], f"{p}/qkv_proj/Add")[0]
        qkv_in = [qkv, "", ""]
    else:
        outs = []
        for nm, w, b in (("q_proj", L.q, L.q_bias), ("k_proj", L.k, L.k_bias), ("v_proj", L.v, L.v_bias)):
            y = graph_linear.linear(g, x, w, f"{p}/{nm}", lvl)
            if b is not None:
                y = g.node("Add", [y, g.init(f"{p}/{nm}.bias", b.astype(np.float32))], f"{p}/{nm}/Add")[0]
            outs.append(y)
        if L.q_norm is not None:
            outs[0] = _head_norm(g, outs[0], L.q_norm, spec.heads, spec, f"{p}/q_norm")
            outs[1] = _head_norm(g, outs[1], L.k_norm, spec.kv_heads, spec, f"{p}/k_norm")
        qkv_in = outs
    local = spec.local_layers is not None and spec.local_layers[i]
    cache = "_local" if local and spec.local_rope_theta is not None else ""
    own = spec.attention == OWN_ATTENTION  # fp32 q/k/v and rotary tables; the cache's rounding is the op's
    half = spec.kv_dtype == "float16"
    if half and not own:  # GroupQueryAttention's T covers q/k/v, caches and cos/sin: all fp16, the output cast back
        qkv_in = [g.node("Cast", [t], f"{p}/{nm}/CastF16", to=10)[0] if t else t
                  for t, nm in zip(qkv_in, ("q", "k", "v"))]
        cache += "_f16"
    if own:
        op, domain, extra = OWN_ATTENTION if half else OWN_ATTENTION + "F32", "edge_spec", {}
    else:
        op, domain, extra = "GroupQueryAttention", "com.microsoft", {"do_rotary": 1, "rotary_interleaved": 0}
    att = g.node(op, [*qkv_in, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total,
                      f"cos_cache{cache}", f"sin_cache{cache}"], f"{p}/{op}", domain=domain,
                 outputs=[f"{p}/{op}/output_0", f"present.{i}.key", f"present.{i}.value"],
                 num_heads=spec.heads, kv_num_heads=spec.kv_heads,
                 scale=float(1.0 / np.sqrt(spec.head_dim) if spec.attn_scale is None else spec.attn_scale),
                 local_window_size=_window(spec, i), softcap=float(spec.attn_softcap), **extra)[0]
    if half and not own:
        att = g.node("Cast", [att], f"{p}/GroupQueryAttention/CastF32", to=1)[0]
    return graph_linear.linear(g, att, L.o, f"{p}/o_proj", lvl)


def _mlp(g: GraphWriter, x: str, i: int, L: Layer, spec: GraphSpec) -> str:
    p = f"/model/layers.{i}/mlp"
    fused = (concat_rows([L.gate, L.up]) if all(is_quant(w) or is_split(w) or is_kquant(w) for w in (L.gate, L.up))
             else None)
    if fused is not None:  # one kernel launch instead of two; rows are independent, so this is exact
        gu = graph_linear.linear(g, x, fused, f"{p}/gate_up_proj", spec.accuracy_level)
        n = g.init(f"{p}/gate_up_proj.split", np.array([L.gate.n, L.up.n], dtype=np.int64))
        gate, up = g.node("Split", [gu, n], f"{p}/gate_up_proj/Split", n_out=2, axis=-1)
    else:
        gate = graph_linear.linear(g, x, L.gate, f"{p}/gate_proj", spec.accuracy_level)
        up = graph_linear.linear(g, x, L.up, f"{p}/up_proj", spec.accuracy_level)
    if spec.activation == "gelu_tanh":  # Gemma: gelu_pytorch_tanh (ONNX Gelu-20, tanh approximation)
        act = g.node("Gelu", [gate], f"{p}/act_fn/Gelu", approximate="tanh")[0]
    else:
        sig = g.node("Sigmoid", [gate], f"{p}/act_fn/Sigmoid")[0]
        act = g.node("Mul", [gate, sig], f"{p}/act_fn/Mul")[0]
    h = g.node("Mul", [act, up], f"{p}/Mul")[0]
    return graph_linear.linear(g, h, L.down, f"{p}/down_proj", spec.accuracy_level)


def _rms(g: GraphWriter, x: str, w: np.ndarray, name: str, eps: float) -> str:
    """A plain RMSNorm of ``x`` [1, S, hidden] with weight ``w`` (Gemma's post-attention / post-MLP norms)."""
    return g.node("SimplifiedLayerNormalization", [x, g.init(f"{name}.weight", w.astype(np.float32))], f"/{name}",
                  epsilon=eps, axis=-1, stash_type=1)[0]


def _features(g: GraphWriter, streams: list[str]) -> str:
    """``hidden_states`` [1, S, len(streams) * hidden] float16: the residual streams side by side (fp16 halves the
    runtime's feature history; a drafter's input needs no more)."""
    cat = g.node("Concat", streams, "/features/Concat", axis=-1)[0] if len(streams) > 1 else streams[0]
    return g.node("Cast", [cat], "/features/Cast", to=10, outputs=["hidden_states"])[0]




def prologue(g: GraphWriter, spec: GraphSpec) -> tuple[str, str]:
    """Rotary caches and GroupQueryAttention's (seqlens_k, total_sequence_length) from ``attention_mask``."""
    cos, sin = rope_caches(spec)
    suffix = "_f16" if spec.kv_dtype == "float16" and spec.attention != OWN_ATTENTION else ""
    dtype = np.float16 if suffix else np.float32
    g.init(f"cos_cache{suffix}", cos.astype(dtype))
    g.init(f"sin_cache{suffix}", sin.astype(dtype))
    if spec.local_rope_theta is not None:  # Gemma 3: local layers rotate with their own base, unscaled
        lcos, lsin = rope_caches(dataclasses.replace(spec, rope_theta=spec.local_rope_theta, rope_factors=None,
                                                     rope_linear=1.0))
        g.init(f"cos_cache_local{suffix}", lcos.astype(dtype))
        g.init(f"sin_cache_local{suffix}", lsin.astype(dtype))
    one = g.init("one_i64", np.array([1], dtype=np.int64))
    total_sum = g.node("ReduceSum", ["attention_mask", one], "/mask/ReduceSum", keepdims=0)[0]
    seqlens = g.node("Cast", [g.node("Sub", [total_sum, one], "/mask/Sub")[0]], "/mask/Cast", to=6)[0]
    shape = g.node("Shape", ["attention_mask"], "/mask/Shape")[0]
    total = g.node("Gather", [shape, g.init("one_scalar", np.array(1, dtype=np.int64))], "/mask/Gather", axis=0)[0]
    return seqlens, g.node("Cast", [total], "/mask/Gather/Cast", to=6)[0]


def build_decoder(dec: Decoder, spec: GraphSpec, out_path: Path) -> Path:
    """Write ``out_path`` (model.onnx) and its external data ``model.onnx.data``; returns ``out_path``.

    The embedding's tensors (``embed.*``) go to their own file, :data:`EMBED_DATA`, so that two graphs
    built on the same embedding hold byte-identical files the exporter can store once."""
    from onnx import TensorProto, helper

    g = GraphWriter(out_path)
    seqlens, total = prologue(g, spec)
    h = _embedding(g, dec)
    if spec.embed_scale is not None:  # Gemma: embeddings times sqrt(hidden), in fp32 as transformers and GGML
        h = g.node("Mul", [h, g.init("embed_scale", np.array(spec.embed_scale, dtype=np.float32))],
                   "/embed/Scale")[0]
    residual, prev_out = h, None
    eps = float(spec.rms_eps)
    streams: dict[int, str] = {}  # layer id -> the residual stream entering it (what a feature drafter reads)
    for i, L in enumerate(dec.layers):
        p = f"/model/layers.{i}"
        w_in = g.init(f"model.layers.{i}.input_layernorm.weight", L.attn_norm.astype(np.float32))
        if prev_out is None:
            x = g.node("SimplifiedLayerNormalization", [residual, w_in], f"{p}/input_layernorm", epsilon=eps,
                       axis=-1, stash_type=1)[0]
        else:
            x, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [residual, prev_out, w_in],
                                       f"{p}/input_layernorm", n_out=4, domain="com.microsoft", epsilon=eps)
        streams[i] = residual
        a = _attention(g, x, i, L, spec, seqlens, total)
        if L.post_attn_norm is not None:
            a = _rms(g, a, L.post_attn_norm, f"model.layers.{i}.post_attention_norm", eps)
        w_post = g.init(f"model.layers.{i}.post_attention_layernorm.weight", L.ffn_norm.astype(np.float32))
        x, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [residual, a, w_post],
                                   f"{p}/post_attention_layernorm", n_out=4, domain="com.microsoft", epsilon=eps)
        prev_out = _mlp(g, x, i, L, spec)
        if L.post_ffn_norm is not None:
            prev_out = _rms(g, prev_out, L.post_ffn_norm, f"model.layers.{i}.post_feedforward_layernorm", eps)
    w_f = g.init("model.norm.weight", dec.final_norm.astype(np.float32))
    x, _, _, streams[len(dec.layers)] = g.node("SkipSimplifiedLayerNormalization", [residual, prev_out, w_f],
                                               "/model/norm", n_out=4, domain="com.microsoft", epsilon=eps)
    if spec.feature_layers:
        _features(g, [streams[j] for j in spec.feature_layers])
    keeps = graph_linear.rows_alone(dec.lm_head, spec.accuracy_level)
    if keeps:
        x = graph_linear.keep_rows(g, x)
    tied, lvl = dec.lm_head is dec.embed, spec.accuracy_level
    if spec.final_softcap > 0:  # Gemma 2: logits = cap * tanh(logits / cap), in the order transformers uses
        cap = g.init("final_softcap", np.array(spec.final_softcap, dtype=np.float32))
        head = graph_linear.lm_head(g, x, dec.lm_head, tied, lvl, out="/lm_head/output")
        z = g.node("Div", [head, cap], "/softcap/Div")[0]
        g.node("Mul", [g.node("Tanh", [z], "/softcap/Tanh")[0], cap], "/softcap/Mul", outputs=["logits"])
    else:
        graph_linear.lm_head(g, x, dec.lm_head, tied, lvl)
    vocab_out = n_rows(dec.lm_head)

    extra_out = []
    keep_in = [helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1])] if keeps else []
    if spec.feature_layers:
        extra_out.append(helper.make_tensor_value_info(
            "hidden_states", TensorProto.FLOAT16, ["batch_size", "sequence_length",
                                                   spec.hidden * len(spec.feature_layers)]))
    return save_graph(g, len(dec.layers), int(vocab_out), out_path, kv_layout(spec), extra_inputs=keep_in,
                      extra_outputs=extra_out)
