"""A feature drafter that reads the target (EAGLE-3), in the layout the EAGLE authors and SpecForge publish.

One decoder layer on the target's own hidden states. For a drafter position p it takes the target's
residual stream at p from three layers (``aux_layers``, vLLM's ids: id j = the input of decoder layer j,
i.e. the output of layer j - 1; 0 = the embeddings, L = the last layer's output before the final norm),
fused by ``fc`` [H, 3 T], and the embedding of the *next* token x_{p+1} (the target's embedding, shared),
and predicts x_{p+2} over a draft vocabulary (``lm_head`` [Vd, H]; target id = draft id + d2t[draft id]).
The next draft step reads the layer's own pre-norm output in place of the fused target features:

    h = fc(concat(aux features))   (first step)   |   h = previous pre-norm output   (later steps)
    x = concat(input_layernorm(embed(x_{p+1})), hidden_norm(h))          [2H]
    r = h + o_proj(attention(q/k/v_proj(x)))                              (rotary, own KV cache)
    out = r + mlp(post_attention_layernorm(r));   logits = lm_head(norm(out))

On disk (DRAFTER_DIR), the published EAGLE-3 layout: ``config.json`` (``architectures:
["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``, the
Llama attention/MLP sizes, ``target_hidden_size`` when it differs) and ``model.safetensors`` with ``fc.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``, ``midlayer.self_attn.{q,k,v,o}_proj
.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t`` [Vd] int64,
``t2d`` [V] bool. The embedding is the target's and is not stored (a head that carries ``embed_tokens.weight``
is accepted; export uses the target's, which it must equal in shape).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from edge_spec.errors import EdgeSpecError

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """vLLM's default aux layers for a target without pinned ids: inputs of layers 2, L // 2 and L - 3."""
    return (2, n_layers // 2, n_layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """Sizes of a head. ``hidden`` is the head's width (= the target's hidden size: it reads the target's
    embedding); ``target_hidden`` the width of one aux feature."""

    hidden: int
    target_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    vocab: int  # target vocabulary
    draft_vocab: int
    aux_layers: tuple[int, ...]
    max_position: int = 4096

    @property
    def feature_dim(self) -> int:
        return self.target_hidden * len(self.aux_layers)

    def to_hf(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """config.json in the published layout (what SGLang / vLLM read)."""
        cfg = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": self.hidden,
               "target_hidden_size": self.target_hidden, "num_attention_heads": self.heads,
               "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
               "intermediate_size": self.intermediate, "rms_norm_eps": self.rms_eps, "rope_theta": self.rope_theta,
               "vocab_size": self.vocab, "draft_vocab_size": self.draft_vocab, "num_hidden_layers": 1,
               "hidden_act": "silu", "tie_word_embeddings": False, "max_position_embeddings": self.max_position,
               "torch_dtype": "float16",
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                                "use_aux_hidden_state": True}}
        if extra:
            cfg.update(extra)
        return cfg

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], target_layers: int | None = None, where: str = "the head") -> Eagle3Config:
        """Read a published config.json; one sentence naming what is missing or unsupported."""
        arch = (cfg.get("architectures") or [""])[0]
        if "eagle3" not in arch.lower():
            raise EdgeSpecError(f"{where} is not an EAGLE-3 head (architectures: {arch or 'none'}); pass a directory "
                                "whose config.json names LlamaForCausalLMEagle3.")
        if cfg.get("num_hidden_layers", 1) != 1:
            raise EdgeSpecError(f"{where} has {cfg['num_hidden_layers']} layers; only one-layer EAGLE-3 heads are "
                                "supported.")
        if cfg.get("norm_before_residual"):
            raise EdgeSpecError(f"{where} uses norm_before_residual, which this version does not support.")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
                or cfg.get("eagle_aux_hidden_state_layer_ids")
            if not aux:
                if target_layers is None:
                    raise KeyError("eagle_aux_hidden_state_layer_ids")
                aux = default_aux_layers(target_layers)
            return cls(hidden=hidden, target_hidden=int(cfg.get("target_hidden_size") or hidden), heads=heads,
                       kv_heads=int(cfg.get("num_key_value_heads", heads)),
                       head_dim=int(cfg.get("head_dim") or hidden // heads),
                       intermediate=int(cfg["intermediate_size"]), rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                       rope_theta=float(cfg.get("rope_theta", 10000.0)), vocab=int(cfg["vocab_size"]),
                       draft_vocab=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
                       aux_layers=tuple(int(i) for i in aux),
                       max_position=int(cfg.get("max_position_embeddings", 4096)))
        except (KeyError, TypeError, ValueError) as exc:
            raise EdgeSpecError(f"{where}'s config.json lacks or mangles {exc}; it is not a complete EAGLE-3 "
                                "config.") from None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split (HF) order. x [B, h, S, d]; cos/sin [S, d / 2]."""
    a, b = x.chunk(2, -1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)


def rope_tables(cfg: Eagle3Config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [S, head_dim / 2] at ``positions`` [S] (float32, as transformers computes them)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    f = positions.float()[:, None] * inv[None]
    return f.cos(), f.sin()


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, S, 2H] -> q [B, heads, S, d], k / v [B, kv_heads, S, d] (q and k rotated)."""
        b, s, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        return rope(q, cos, sin), rope(k, cos, sin), v


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.hidden_norm = RMSNorm(c.hidden, c.rms_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.mlp = _MLP(c)


class Eagle3Head(nn.Module):
    """The head's trainable tensors (names = the published layout) and its maps. ``embed`` is passed in."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.c = c
        self.fc = nn.Linear(c.feature_dim, c.hidden, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden, c.rms_eps)
        self.lm_head = nn.Linear(c.hidden, c.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab, dtype=torch.int64))  # draft id -> target id - draft id
        self.register_buffer("t2d", torch.zeros(c.vocab, dtype=torch.bool))  # target id kept in the draft vocabulary

    @property
    def draft_to_target(self) -> torch.Tensor:
        """[Vd] target id of each draft id."""
        return torch.arange(self.c.draft_vocab, device=self.d2t.device) + self.d2t

    def set_vocab(self, kept: torch.Tensor) -> None:
        """``kept`` [Vd]: the target ids of the draft vocabulary, ascending (as SpecForge writes d2t)."""
        kept = torch.as_tensor(kept, dtype=torch.int64).sort().values
        self.d2t.copy_(kept - torch.arange(len(kept)))
        self.t2d.zero_()
        self.t2d[kept] = True

    def layer_inputs(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """[B, S, 2H] attention input from hidden h [B, S, H] and token embeddings e [B, S, H]."""
        m = self.midlayer
        return torch.cat((m.input_layernorm(e), m.hidden_norm(h)), -1)

    def layer_outputs(self, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Pre-norm output [B, S, H] from hidden h and the attention's output [B, S, heads * d]."""
        m = self.midlayer
        r = h + m.self_attn.o_proj(att)
        return r + m.mlp(m.post_attention_layernorm(r))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))

    def forward_chain(self, e: torch.Tensor, features: torch.Tensor, depth: int,
                      with_logits: bool = True) -> list[tuple[torch.Tensor, ...]]:
        """Training-time test: ``depth`` draft steps at every position, as the runtime will run them.

        e [B, S, H]: embedding of the token after each position (x_{p+1}); features [B, S, 3T] (aux at p).
        Step d (0-based) at position q reads step d-1's output at q - 1 (step 0 reads fc(features[q])) and
        attends to step 0's keys at positions <= q - d (the committed context) plus the chain's own keys at
        q - d + 1 .. q. Returns per step (pre-norm output [B, S, H], logits [B, S, Vd] or None when
        ``with_logits`` is False: the caller applies :meth:`logits` to the rows it needs); rows q < d are
        meaningless (no chain reaches them) and must be masked by the caller."""
        c = self.c
        b, s, _ = e.shape
        cos, sin = rope_tables(c, torch.arange(s, device=e.device))
        cos, sin = cos.to(e.dtype), sin.to(e.dtype)
        rep = c.heads // c.kv_heads
        h = self.fc(features)
        keys: list[torch.Tensor] = []
        vals: list[torch.Tensor] = []
        outs = []
        causal = torch.ones(s, s, dtype=torch.bool, device=e.device).tril()
        for d in range(depth):
            if d:
                h = torch.cat((torch.zeros_like(h[:, :1]), h[:, :-1]), 1)  # step d reads step d-1 at q - 1
            q, k, v = self.midlayer.self_attn.qkv(self.layer_inputs(h, e), cos, sin)
            keys.append(k.repeat_interleave(rep, 1))
            vals.append(v.repeat_interleave(rep, 1))
            scale = 1.0 / math.sqrt(c.head_dim)
            base = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B, h, S, S]
            base = base.masked_fill(~causal.tril(-d), float("-inf"))  # step-0 keys at positions <= q - d
            chain = []
            for j in range(1, d + 1):  # the chain's own key of step j sits at q - (d - j)
                kj = _shift(keys[j], d - j)
                chain.append((q * kj).sum(-1, keepdim=True) * scale)  # [B, h, S, 1]
            scores = torch.cat([base, *chain], -1)
            p = torch.softmax(scores.float(), -1).to(q.dtype)
            p = torch.nan_to_num(p)  # rows with no visible key (q < d) are masked by the caller anyway
            att = torch.matmul(p[..., :s], vals[0])
            for j in range(1, d + 1):
                att = att + p[..., s + j - 1:s + j] * _shift(vals[j], d - j)
            att = att.transpose(1, 2).reshape(b, s, c.heads * c.head_dim)
            h = self.layer_outputs(h, att)
            outs.append((h, self.logits(h) if with_logits else None))
        return outs


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, h, S, d] moved n positions later along S (zeros first)."""
    if n == 0:
        return x
    return torch.cat((torch.zeros_like(x[:, :, :n]), x[:, :, :-n]), 2)


def save_head(head: Eagle3Head, out: Path, extra: dict[str, Any] | None = None) -> None:
    """config.json + model.safetensors (fp16 weights, int64 d2t, bool t2d), written atomically."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in head.state_dict().items():
        tensors[k] = v.detach().cpu().contiguous() if k in ("d2t", "t2d") else \
            v.detach().to(torch.float16).cpu().contiguous()
    save_file(tensors, str(out / "model.safetensors.tmp"), metadata={"format": "pt"})
    (out / "model.safetensors.tmp").replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(head.c.to_hf(extra), indent=2, sort_keys=True) + "\n")


def read_head(path: Path, target_layers: int | None = None) -> tuple[Eagle3Config, dict[str, torch.Tensor], dict]:
    """(config, tensors as float32 / int64 / bool, raw config.json) of a head directory; one sentence when unusable."""
    from safetensors.torch import load_file

    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    cfg = Eagle3Config.from_hf(raw, target_layers, where=f"'{path}'")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise EdgeSpecError(f"'{path}' has no .safetensors weights; an EAGLE-3 head needs model.safetensors.")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            tensors[k.removeprefix("model.")] = v if k in ("d2t", "t2d") else v.float()
    need = ["fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
            "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
            "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "midlayer.input_layernorm.weight",
            "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight", "norm.weight",
            "lm_head.weight"]
    missing = [k for k in need if k not in tensors]
    if missing:
        raise EdgeSpecError(f"'{path}' lacks the tensor {missing[0]}; it is not a complete EAGLE-3 head.")
    if tensors["fc.weight"].shape != (cfg.hidden, cfg.feature_dim):
        raise EdgeSpecError(f"'{path}': fc.weight is {list(tensors['fc.weight'].shape)} but the config says "
                            f"[{cfg.hidden}, {cfg.feature_dim}] ({len(cfg.aux_layers)} aux layers of "
                            f"{cfg.target_hidden}); the head is inconsistent.")
    if cfg.draft_vocab != cfg.vocab and "d2t" not in tensors:
        raise EdgeSpecError(f"'{path}' has a draft vocabulary of {cfg.draft_vocab} but no d2t map.")
    return cfg, tensors, raw


def load_head(path: Path, target_layers: int | None = None) -> Eagle3Head:
    """A head directory as an :class:`Eagle3Head` (float32)."""
    cfg, tensors, _ = read_head(path, target_layers)
    head = Eagle3Head(cfg)
    state = {k: v for k, v in tensors.items() if k in head.state_dict()}
    if "d2t" not in state:
        head.set_vocab(torch.arange(cfg.draft_vocab))
        state.pop("t2d", None)
    head.load_state_dict(state, strict=False)
    return head


@torch.no_grad()
def step(head: Eagle3Head, e: torch.Tensor, h: torch.Tensor, start: int,
         cache: list[torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One runtime pass, the reference the exported graph is checked against.

    e [k, H] embeddings of the rows' next tokens, h [k, H] the rows' hidden input (fc(features) or an earlier
    pre-norm output), ``start`` the position of the first row, ``cache`` [keys, values] each
    [kv_heads, start, d] (None when start is 0). Returns (pre-norm output [k, H], logits [k, Vd], new cache)."""
    c = head.c
    k = e.shape[0]
    cos, sin = rope_tables(c, torch.arange(start, start + k))
    q, kk, v = head.midlayer.self_attn.qkv(head.layer_inputs(h[None], e[None]), cos, sin)
    if cache is not None:
        kk = torch.cat((cache[0][None], kk), 2)
        v = torch.cat((cache[1][None], v), 2)
    rep = c.heads // c.kv_heads
    scores = torch.matmul(q, kk.repeat_interleave(rep, 1).transpose(-1, -2)) / math.sqrt(c.head_dim)
    total = start + k
    allowed = torch.ones(k, total, dtype=torch.bool).tril(start)  # row i sees positions <= start + i
    att = torch.matmul(torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1), v.repeat_interleave(rep, 1))
    out = head.layer_outputs(h[None], att.transpose(1, 2).reshape(1, k, -1))[0]
    return out, head.logits(out), [kk[0], v[0]]
