"""An EAGLE-3 head before it trains: its draft vocabulary, its shape, its start from the target's layers, and the
surgery that lets a trained head continue (a wider MLP, a larger vocabulary); after training, the feature scaling
folded into ``fc`` so the saved head reads raw target features.

Training itself is ``eagle_train.py``'s; the head's modules are ``eagle.py``'s.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from edge_spec.distill.eagle import Eagle3Config, Eagle3Head
from edge_spec.distill.sequence import Sequence

DEFAULT_DRAFT_VOCAB = 8192


def choose_vocab(seqs: list[Sequence], vocab: int, size: int, always: tuple[int, ...] = (),
                 ranked: bool = False) -> np.ndarray:
    """The ``size`` target ids the target writes most in ``seqs``' answers (plus ``always``), ascending (``ranked``:
    most written first)."""
    counts = np.zeros(vocab, np.int64)
    for s in seqs:
        np.add.at(counts, np.asarray(s.ids[s.prompt_len:], np.int64), 1)
    counts[list(always)] = counts.max() + 1
    size = min(size, vocab)
    kept = np.argsort(-counts, kind="stable")[:size]
    return kept if ranked else np.sort(kept)


def head_config(model: torch.nn.Module, aux: tuple[int, ...], draft_vocab: int) -> Eagle3Config:
    """An EAGLE-3 head shaped like one of the target's layers (it can start from them)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Eagle3Config(hidden=c.hidden_size, target_hidden=c.hidden_size, heads=c.num_attention_heads,
                        kv_heads=c.num_key_value_heads, head_dim=head_dim, intermediate=c.intermediate_size,
                        rms_eps=float(c.rms_norm_eps), rope_theta=float(getattr(c, "rope_theta", None) or
                                                                          (c.rope_parameters or {}).get(
                                                                              "rope_theta", 10000.0)),
                        vocab=c.vocab_size, draft_vocab=draft_vocab, aux_layers=tuple(aux),
                        max_position=int(getattr(c, "max_position_embeddings", 4096)))


@torch.no_grad()
def init_head(model: torch.nn.Module, cfg: Eagle3Config, kept: np.ndarray, scale: np.ndarray) -> Eagle3Head:
    """A head that starts from the target: attention reads the embedding like layer 0 and the hidden state like the
    last layer; MLP, norms and LM head (rows of the draft vocabulary) are the target's; ``fc`` passes the last aux
    feature through unchanged."""
    head = Eagle3Head(cfg)
    head.set_vocab(torch.from_numpy(kept))
    layers = model.model.layers
    first, last = layers[0], layers[-1]
    att, m = head.midlayer.self_attn, head.midlayer
    h = cfg.hidden
    for name in ("q_proj", "k_proj", "v_proj"):
        w = getattr(att, name).weight
        w[:, :h] = getattr(first.self_attn, name).weight
        w[:, h:] = getattr(last.self_attn, name).weight
    att.o_proj.weight.copy_(last.self_attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(m.mlp, name).weight.copy_(getattr(last.mlp, name).weight)
    m.input_layernorm.weight.copy_(first.input_layernorm.weight)
    m.hidden_norm.weight.copy_(last.input_layernorm.weight)
    m.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
    head.norm.weight.copy_(model.model.norm.weight)
    head.lm_head.weight.copy_(model.lm_head.weight[torch.from_numpy(kept)])
    fc = torch.zeros(cfg.hidden, cfg.feature_dim)
    t = cfg.target_hidden
    fc[:, -t:] = torch.diag(torch.from_numpy(1.0 / scale[-t:]))  # fc(x * scale) = the last aux feature
    head.fc.weight.copy_(fc)
    return head


@torch.no_grad()
def resize_mlp(head: Eagle3Head, width: int, seed: int = 0) -> Eagle3Head:
    """A copy of ``head`` whose MLP has ``width`` units (every other tensor the same).

    Widening keeps every unit and adds units whose down-projection columns are zero (their gate / up rows random
    at the scale of the existing rows), so the wider head computes exactly what ``head`` did and training grows
    them from there; narrowing keeps the ``width`` units with the largest down-projection columns."""
    old = head.midlayer.mlp
    wide = Eagle3Head(replace(head.c, intermediate=width))
    state = {k: v for k, v in head.state_dict().items() if ".mlp." not in k}
    wide.load_state_dict(state, strict=False)
    n = head.c.intermediate
    gate, up, down = old.gate_proj.weight, old.up_proj.weight, old.down_proj.weight  # [n, H], [n, H], [H, n]
    new = wide.midlayer.mlp
    if width <= n:
        keep = down.norm(dim=0).topk(width).indices.sort().values
        new.gate_proj.weight.copy_(gate[keep])
        new.up_proj.weight.copy_(up[keep])
        new.down_proj.weight.copy_(down[:, keep])
        return wide
    g = torch.Generator().manual_seed(seed)
    extra = width - n
    new.gate_proj.weight.copy_(torch.cat((gate, torch.randn(extra, gate.shape[1], generator=g) * gate.std())))
    new.up_proj.weight.copy_(torch.cat((up, torch.randn(extra, up.shape[1], generator=g) * up.std())))
    new.down_proj.weight.copy_(torch.cat((down, torch.zeros(down.shape[0], extra)), 1))
    return wide


@torch.no_grad()
def grow_vocab(head: Eagle3Head, extra: np.ndarray) -> Eagle3Head:
    """A copy of ``head`` whose draft vocabulary also holds the target ids ``extra`` [n] (none of them already in it).

    Every kept token keeps its trained LM-head row; every new token's row starts as the mean of the trained rows, so
    it scores the mean logit and the grown head drafts what ``head`` did (on SmolLM2's demo head: the same held-out
    acceptance to three decimals at every depth); training then tells the new rows apart. (Rows from the target's
    own LM head, as a fresh head starts, outscored the trained rows where the head's output has drifted from the
    target's: held-out acceptance fell from 0.45 to 0.04, and to 0.19 with the trained rows' mean change added.)
    Every other tensor is the same. The vocabulary stays ascending in target ids (the published d2t layout), so
    draft ids of kept tokens may move."""
    old_ids = head.draft_to_target
    extra_t = torch.as_tensor(np.asarray(extra), dtype=torch.int64)
    if bool(head.t2d[extra_t].any()):
        raise ValueError("grow_vocab: some extra ids are already in the draft vocabulary")
    ids, order = torch.cat((old_ids, extra_t)).sort()
    big = Eagle3Head(replace(head.c, draft_vocab=len(ids)))
    state = {k: v for k, v in head.state_dict().items() if not k.startswith(("lm_head.", "d2t", "t2d"))}
    big.load_state_dict(state, strict=False)
    big.set_vocab(ids)
    trained = head.lm_head.weight
    rows = trained.mean(0, keepdim=True).expand(len(ids), -1).clone()
    was = order < len(old_ids)
    rows[was] = trained[order[was]]
    big.lm_head.weight.copy_(rows)
    return big


def fold_scale(head: Eagle3Head, scale: np.ndarray) -> None:
    """Fold the training-time feature scaling into ``fc`` so the saved head reads raw target features."""
    with torch.no_grad():
        head.fc.weight.mul_(torch.from_numpy(scale)[None, :])
