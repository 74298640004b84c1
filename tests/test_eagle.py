"""EAGLE-3 feature drafters: the head in the published layout (round trip, refusals), its training-time-test
chain equal to the runtime's incremental steps, and the export of a tiny GGUF target + head: the target's
features equal transformers' hidden states on the same file, the drafter graph equals the torch reference,
and through the Engine greedy speculative == greedy AR and same seed -> same sampled text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from test_gguf_export import FFN, HEAD, HEADS, HIDDEN, KV_HEADS, assert_greedy_sd_equals_ar, write_tiny_gguf  # noqa: E402

from edge_spec.distill.eagle import Eagle3Config, Eagle3Head, load_head, read_head, save_head, step  # noqa: E402
from edge_spec.errors import EdgeSpecError, ExportError  # noqa: E402
from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle  # noqa: E402

# the reference export (exact weights, fp32 activations and KV, fp32 drafter): what is compared with torch
REFERENCE = ExportOptions(trim_vocab=None, max_context=64, measure_memory=False, drafter_quant=Quant("fp32", None),
                          target_quant=Quant("int4", 1), gguf_mode="exact", kv_dtype="float32")


def _config(vocab: int = 300, draft_vocab: int = 120, aux: tuple[int, ...] = (0, 2, 3)) -> Eagle3Config:
    return Eagle3Config(hidden=HIDDEN, target_hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD,
                        intermediate=FFN, rms_eps=1e-6, rope_theta=10000.0, vocab=vocab, draft_vocab=draft_vocab,
                        aux_layers=aux, max_position=256)


def random_head(cfg: Eagle3Config, seed: int = 0) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.mul_(3.0)  # sharper logits than nn.Linear's default init
    kept = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(seed))[:cfg.draft_vocab]
    head.set_vocab(kept)
    return head


def test_training_chain_equals_the_runtime_incremental_steps():
    """forward_chain's step d at position q == the runtime: feature rows 0..q-d in one pass, then d own steps."""
    cfg = _config()
    head = random_head(cfg).eval()
    s, depth = 9, 3
    g = torch.Generator().manual_seed(1)
    e = torch.randn(1, s, HIDDEN, generator=g)
    feats = torch.randn(1, s, cfg.feature_dim, generator=g) * 3
    with torch.no_grad():
        chain = head.forward_chain(e, feats, depth)
        h0 = head.fc(feats)[0]
    for d in range(depth):
        for q in range(d, s):
            out, logits, cache = step(head, e[0, :q - d + 1], h0[:q - d + 1], 0, None)
            h = out[-1:]
            for j in range(1, d + 1):
                r = q - d + j
                h, logits, cache = step(head, e[0, r:r + 1], h, r, cache)
            torch.testing.assert_close(logits[-1], chain[d][1][0, q], rtol=1e-4, atol=1e-4)


def test_resize_mlp_widens_without_changing_the_head_and_narrows_to_its_strongest_units():
    from edge_spec.distill.eagle_init import resize_mlp

    head = random_head(_config()).eval()
    g = torch.Generator().manual_seed(2)
    e = torch.randn(2, 7, HIDDEN, generator=g)
    feats = torch.randn(2, 7, head.c.feature_dim, generator=g) * 3
    wide = resize_mlp(head, 2 * FFN + 5).eval()
    assert wide.c.intermediate == 2 * FFN + 5 and wide.midlayer.mlp.down_proj.weight.shape == (HIDDEN, 2 * FFN + 5)
    assert torch.equal(wide.draft_to_target, head.draft_to_target)
    with torch.no_grad():
        before, after = head.forward_chain(e, feats, 3), wide.forward_chain(e, feats, 3)
    for (h0, l0), (h1, l1) in zip(before, after):
        torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5)
    assert wide.midlayer.mlp.gate_proj.weight[FFN:].abs().sum() > 0  # new units can learn (their down starts at 0)
    narrow = resize_mlp(head, FFN // 2)
    down = head.midlayer.mlp.down_proj.weight
    keep = down.norm(dim=0).topk(FFN // 2).indices.sort().values
    assert torch.equal(narrow.midlayer.mlp.down_proj.weight, down[:, keep])
    assert torch.equal(narrow.midlayer.mlp.up_proj.weight, head.midlayer.mlp.up_proj.weight[keep])


def test_grow_vocab_keeps_every_kept_tokens_logit_and_starts_new_rows_at_the_targets():
    """A head's vocabulary grown by ids it lacked: d2t stays ascending and t2d covers both sets; at every position
    and depth each kept token's logit is what it was, and each new token's row is the mean of the trained rows (it
    scores the mean logit, so the grown head drafts what the head did)."""
    from edge_spec.distill.eagle_init import grow_vocab

    head = random_head(_config()).eval()
    lacked = np.flatnonzero(~head.t2d.numpy())
    extra = np.random.default_rng(4).permutation(lacked)[:45]
    big = grow_vocab(head, extra).eval()
    ids = big.draft_to_target
    assert big.c.draft_vocab == 165 and bool((ids[1:] > ids[:-1]).all())
    assert set(ids.tolist()) == set(head.draft_to_target.tolist()) | set(extra.tolist())
    assert int(big.t2d.sum()) == 165 and bool(big.t2d[torch.from_numpy(extra)].all())
    g = torch.Generator().manual_seed(5)
    e = torch.randn(2, 7, HIDDEN, generator=g)
    feats = torch.randn(2, 7, head.c.feature_dim, generator=g) * 3
    with torch.no_grad():
        before, after = head.forward_chain(e, feats, 3), big.forward_chain(e, feats, 3)
    where = {int(t): j for j, t in enumerate(ids)}
    cols = torch.tensor([where[int(t)] for t in head.draft_to_target])
    for (h0, l0), (h1, l1) in zip(before, after):
        torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(l1[..., cols], l0, rtol=1e-5, atol=1e-5)
    new_cols = torch.tensor([where[int(t)] for t in extra])
    mean_row = head.lm_head.weight.mean(0)
    assert all(torch.allclose(big.lm_head.weight[c], mean_row) for c in new_cols)
    for _, l1 in after:  # a new token never outscores every kept one: the mean logit is below the max
        assert bool((l1[..., new_cols].max(-1).values < l1[..., cols].max(-1).values).all())
    with pytest.raises(ValueError, match="already"):
        grow_vocab(head, head.draft_to_target[:2].numpy())


def test_head_round_trips_in_the_published_layout(tmp_path: Path):
    cfg = _config()
    head = random_head(cfg)
    save_head(head, tmp_path / "h", extra={"edge_spec_drafter": {"target_sha256": "ab" * 32}})
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["draft_vocab_size"] == 120
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    back = load_head(tmp_path / "h")
    assert back.c == cfg
    assert torch.equal(back.draft_to_target, head.draft_to_target)
    assert int(back.t2d.sum()) == 120 and bool(back.t2d[back.draft_to_target].all())
    for k, v in head.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k].to(v.dtype), v.half().to(v.dtype) if v.is_floating_point()
                                   else v)


def test_unusable_heads_are_refused_in_one_sentence(tmp_path: Path):
    cfg = _config()
    save_head(random_head(cfg), tmp_path / "h")
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    cases = {"not an EAGLE-3 head": {**raw, "architectures": ["LlamaForCausalLM"]},
             "only one-layer": {**raw, "num_hidden_layers": 2},
             "lacks or mangles": {k: v for k, v in raw.items() if k != "intermediate_size"},
             "fc.weight is": {**raw, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}}
    for want, bad in cases.items():
        (tmp_path / "h" / "config.json").write_text(json.dumps(bad))
        with pytest.raises(EdgeSpecError, match=want) as err:
            read_head(tmp_path / "h")
        assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def eagle_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Eagle3Head]:
    """(tiny 3-layer llama GGUF, its EAGLE-3 head dir reading layers 0, 2 and 3, the head in torch)."""
    from edge_spec.export import own_build
    from edge_spec.fetch import file_sha256

    d = tmp_path_factory.mktemp("eagle")
    target = write_tiny_gguf(d / "t.gguf", "llama", 3, seed=1)
    vocab = int(own_build.gguf_source(str(target), "target").config["vocab_size"])
    head = random_head(_config(vocab=vocab))
    save_head(head, d / "head", extra={"edge_spec_drafter": {"target_sha256": file_sha256(target)}})
    return target, d / "head", load_head(d / "head")  # the fp16-rounded weights the export reads


@pytest.mark.slow
def test_eagle_bundle_matches_references_and_is_lossless(eagle_pair, tmp_path: Path):
    from transformers import AutoModelForCausalLM

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.engine import Engine
    from edge_spec.runtime.session import ModelSession, shared_initializers

    target, head_dir, head = eagle_pair
    out = tmp_path / "bundle"
    opts = REFERENCE  # compared with torch below
    export_bundle(str(target), str(head_dir), out, opts, progress=None)
    m = read_manifest(out)
    assert m.target.feature_layers == [0, 2, 3] and m.target.feature_dim == 3 * HIDDEN
    assert m.drafter.kind == "eagle3" and m.drafter.num_layers == 1 and m.drafter.vocab_size == 120
    assert m.vocab_trim.kept == 120 and np.array_equal(np.load(out / m.vocab_trim.id_map), head.draft_to_target)
    assert (out / "target/embed.data").samefile(out / "drafter/embed.data") and m.shared_initializers

    # the target's features == transformers' residual streams on the same GGUF (layer 3 = last output, pre-norm)
    ids = [1, 60, 61, 62, 70, 80, 90]
    shared = shared_initializers(out, m)
    t = ModelSession(out / m.target.graph, m.target, providers=["CPUExecutionProvider"], device="cpu", capacity=32,
                     max_rows=8, initializers=shared, features=True)
    t.forward(np.array(ids))
    feats = t.features[:len(ids)].copy()
    hf = AutoModelForCausalLM.from_pretrained(str(target.parent), gguf_file=target.name, dtype=torch.float32)
    last = {}
    hf.model.layers[-1].register_forward_hook(lambda _m, _i, o: last.setdefault("h", o[0] if isinstance(o, tuple)
                                                                               else o))
    with torch.no_grad():
        hs = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    ref = torch.cat([hs[0][0], hs[2][0], last["h"][0]], -1).numpy()
    np.testing.assert_allclose(feats.astype(np.float32), ref, rtol=2e-2, atol=2e-2 * float(np.abs(ref).max()))

    # the drafter graph == the torch reference: a pass over feature rows, then a step on its own output
    d = ModelSession(out / m.drafter.graph, m.drafter, providers=["CPUExecutionProvider"], device="cpu",
                     capacity=32, max_rows=8, initializers=shared)
    nxt = np.array(ids[1:])
    logits = d.forward(nxt, feats[:len(nxt)]).copy()
    with torch.no_grad():
        emb = hf.model.embed_tokens(torch.tensor(nxt))
        h_in = head.fc(torch.from_numpy(feats[:len(nxt)].astype(np.float32)))
        o, ref_logits, cache = step(head, emb, h_in, 0, None)
    np.testing.assert_allclose(logits, ref_logits.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(d.hidden[:len(nxt)], o.numpy(), rtol=1e-3, atol=1e-3)
    own = d.forward(np.array([5])).copy()
    with torch.no_grad():
        _, ref_own, _ = step(head, hf.model.embed_tokens(torch.tensor([5])), o[-1:], len(nxt), cache)
    np.testing.assert_allclose(own, ref_own.numpy(), rtol=1e-3, atol=1e-3)

    engine = Engine.load(out, max_context=64)
    assert engine.plan.mode == "speculative"
    assert any("feature history" in what for what, _ in engine.plan.items)
    assert_greedy_sd_equals_ar(engine, 16)
    cfg = {"max_new_tokens": 16, "stop_token_ids": (), "temperature": 0.8, "seed": 4}
    a, b = engine.generate("hello world", cfg), engine.generate("hello world", cfg)
    assert a.token_ids == b.token_ids == engine.generate("hello world", cfg, speculative=False).token_ids
    fixed = engine.generate("hello world", cfg, draft_length=3)  # drafts every step, however loaded the machine
    assert fixed.token_ids == a.token_ids and fixed.stats.drafted > 0


@pytest.mark.slow
def test_a_head_with_another_mlp_width_exports_and_matches_torch(eagle_pair, tmp_path: Path):
    """A head whose MLP is wider than the target's (distill --head-mlp) exports as any other: the drafter graph
    equals the torch reference and greedy speculative == greedy AR."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from edge_spec.bundle import read_manifest
    from edge_spec.fetch import file_sha256
    from edge_spec.runtime.engine import Engine
    from edge_spec.runtime.session import ModelSession, shared_initializers

    target, _, base = eagle_pair
    head = random_head(replace(base.c, intermediate=2 * FFN + 8), seed=3)
    save_head(head, tmp_path / "head", extra={"edge_spec_drafter": {"target_sha256": file_sha256(target)}})
    head = load_head(tmp_path / "head")
    out = tmp_path / "bundle"
    opts = REFERENCE
    export_bundle(str(target), str(tmp_path / "head"), out, opts, progress=None)
    m = read_manifest(out)
    shared = shared_initializers(out, m)
    d = ModelSession(out / m.drafter.graph, m.drafter, providers=["CPUExecutionProvider"], device="cpu",
                     capacity=32, max_rows=8, initializers=shared)
    g = np.random.default_rng(5)
    nxt = np.array([60, 61, 62, 70])
    feats = (g.standard_normal((len(nxt), head.c.feature_dim)) * 3).astype(np.float16)  # as the target writes them
    logits = d.forward(nxt, feats).copy()
    feats = feats.astype(np.float32)

    hf = AutoModelForCausalLM.from_pretrained(str(target.parent), gguf_file=target.name, dtype=torch.float32)
    with torch.no_grad():
        _, ref, _ = step(head, hf.model.embed_tokens(torch.tensor(nxt)), head.fc(torch.from_numpy(feats)), 0, None)
    np.testing.assert_allclose(logits, ref.numpy(), rtol=1e-3, atol=1e-3)
    assert_greedy_sd_equals_ar(Engine.load(out, max_context=64), 12)


@pytest.mark.slow
def test_eagle_export_refuses_a_head_of_another_target(eagle_pair, tmp_path: Path):
    target, head_dir, _ = eagle_pair
    other = write_tiny_gguf(tmp_path / "other.gguf", "llama", 3, seed=2)
    opts = ExportOptions(trim_vocab=None, max_context=64, measure_memory=False)
    with pytest.raises(ExportError, match="trained for a target with sha256") as err:
        export_bundle(str(other), str(head_dir), tmp_path / "o", opts, progress=None)
    assert "\n" not in str(err.value) and not (tmp_path / "o").exists()
    raw = json.loads((head_dir / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(head_dir / "model.safetensors")
    raw.pop("edge_spec_drafter")
    (bad / "config.json").write_text(json.dumps({**raw, "eagle_config": {"eagle_aux_hidden_state_layer_ids":
                                                                          [0, 2, 9]}}))
    with pytest.raises(ExportError, match="reads layer 9 but the target has 3 layers"):
        export_bundle(str(target), str(bad), tmp_path / "o", opts, progress=None)


def _tiny_data():
    from edge_spec.distill.data import DataConfig

    return DataConfig(batch=6, self_instruct=6, magpie=6, max_jobs=4, max_new_tokens=12, heldout_percent=30,
                      eval_prompts=4)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_gguf_alone_then_a_head_distilled_for_it(arch: str, tmp_path: Path):
    """A GGUF exports alone (a lookup-only bundle); distill trains a head for it deterministically; exporting again
    with the head gives a bundle whose greedy speculative output equals greedy AR."""
    from dataclasses import replace

    from safetensors.numpy import load_file
    from test_gguf_archs import LAYERS, write_arch_gguf

    from edge_spec.distill import DistillConfig, distill
    from edge_spec.distill.eagle_train import EagleTrainConfig
    from edge_spec.runtime.engine import Engine

    if arch == "llama":
        target = write_tiny_gguf(tmp_path / "llama.gguf", "llama", 3, seed=1)
    else:
        target = write_arch_gguf(tmp_path / "gemma3.gguf", "gemma3", LAYERS["gemma3"], seed=1)
    opts = ExportOptions(max_context=64, measure_memory=False, trim_vocab=None)
    alone = export_bundle(str(target), None, tmp_path / "alone", opts, progress=None)
    assert alone.drafter is None and alone.target.feature_layers is None and "drafter" not in alone.sources
    engine = Engine.load(tmp_path / "alone", max_context=64)
    assert engine.plan.mode == "lookup"
    assert len(engine.generate("hello world", {"max_new_tokens": 8, "stop_token_ids": ()}).token_ids) == 8

    cfg = DistillConfig(target=target, out=tmp_path / "head", seed=1, threads=1, kind="eagle3", data=_tiny_data(),
                        eagle=EagleTrainConfig(steps=3, batch_seqs=4, eval_every=3, draft_vocab=64, max_len=48,
                                               eval_batch=4))
    distill(cfg, lambda _m: None)
    distill(replace(cfg, out=tmp_path / "again"), lambda _m: None)
    a, b = load_file(str(tmp_path / "head/model.safetensors")), load_file(str(tmp_path / "again/model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    m = export_bundle(str(target), str(tmp_path / "head"), tmp_path / "bundle", opts, progress=None)
    assert m.drafter.kind == "eagle3" and m.vocab_trim.kept == 64
    assert (m.drafter.quantization.precision, m.drafter.quantization.accuracy_level) == ("int8", 4)  # a head's default
    assert_greedy_sd_equals_ar(Engine.load(tmp_path / "bundle", max_context=64), 12)


def test_published_llama3_heads_get_transformers_rope_scaling():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from edge_spec.export.eagle_graph import llama3_rope_factors

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = {"rope_scaling": scaling, "rope_theta": 500000.0, "head_dim": 128, "hidden_size": 4096,
           "num_attention_heads": 32}
    factors = np.array(llama3_rope_factors(cfg))
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**cfg, max_position_embeddings=131072), "cpu")
    base = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    np.testing.assert_allclose(base / factors, inv.numpy(), rtol=1e-6)
    assert llama3_rope_factors({**cfg, "rope_scaling": None}) is None


@pytest.mark.slow
def test_a_head_in_specforge_layout_exports_like_ours(eagle_pair, tmp_path: Path):
    """A published head: no edge-spec metadata, no target_hidden_size, an embed_tokens.weight of its own (ignored:
    the target's is used), a .bin-free safetensors file with a 'model.' prefix on some keys."""
    from safetensors.numpy import load_file, save_file

    from edge_spec.runtime.session import ModelSession, shared_initializers

    target, head_dir, head = eagle_pair
    pub = tmp_path / "published"
    pub.mkdir()
    raw = json.loads((head_dir / "config.json").read_text())
    raw.pop("edge_spec_drafter")
    raw.pop("target_hidden_size")
    (pub / "config.json").write_text(json.dumps(raw))
    tensors = load_file(str(head_dir / "model.safetensors"))
    tensors = {("model." + k if k.startswith("midlayer.mlp") else k): v for k, v in tensors.items()}
    tensors["embed_tokens.weight"] = np.zeros((head.c.vocab, HIDDEN), np.float16)
    save_file(tensors, str(pub / "model.safetensors"))
    opts = ExportOptions(trim_vocab=None, max_context=64, measure_memory=False)
    outs = {}
    for name, src in (("ours", head_dir), ("published", pub)):
        out = tmp_path / f"bundle-{name}"
        m = export_bundle(str(target), str(src), out, opts, progress=None)
        shared = shared_initializers(out, m)
        kw = dict(providers=["CPUExecutionProvider"], device="cpu", capacity=32, max_rows=8, initializers=shared)
        t = ModelSession(out / m.target.graph, m.target, features=True, **kw)
        t.forward(np.array([1, 60, 61, 62]))
        d = ModelSession(out / m.drafter.graph, m.drafter, **kw)
        outs[name] = d.forward(np.array([60, 61, 62]), t.features[:3].copy()).copy()
    np.testing.assert_array_equal(outs["ours"], outs["published"])
