"""GGUF in for Phi-3, Gemma 2 and Gemma 3: tiny random files written here with the metadata keys and tensor names
llama.cpp's converter writes (gguf.constants MODEL_TENSORS), Q4_0 / Q4_1 / Q8_0 tensors, exported with their own
quantization; the graph's logits match transformers loading the same file, the architecture's special parts
(sliding window, soft-capping, local rope base) demonstrably matter, and greedy speculative == greedy AR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_gguf_export import _vocab, finish, write_header, write_tokenizer

from edge_spec.bundle import read_manifest
from edge_spec.errors import ExportError
from edge_spec.export.measure import Decoder
from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS, HEAD = 64, 128, 4, 2, 16
WINDOW = 4  # Gemma sliding window in the tiny files: far shorter than the test prompts
SOFTCAP = {"attn_logit_softcapping": 1.0, "final_logit_softcapping": 5.0}  # small, so that they bite
LAYERS = {"phi3": 2, "gemma2": 2, "gemma3": 6}  # Gemma 3: layers 0-4 local, layer 5 global (pattern 6)
MODES = {"phi3-split": "split", "gemma3-compact": "compact"}  # --gguf-mode; the plain keys use "exact"
HF_ARCH = {"phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


def write_arch_gguf(path: Path, arch: str, layers: int, seed: int, extra_tensors: dict | None = None,
                    rope_linear: float | None = None, rot_dims: int = HEAD) -> Path:
    """A random ``arch`` (phi3 | gemma2 | gemma3) decoder as llama.cpp's converter lays it out; Q8_0 embedding."""
    tokens, merges = _vocab()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    write_header(w, layers)
    if arch == "phi3":  # as conversion/phi.py writes it (sliding_window: llama.cpp disables Phi-3 SWA)
        w.add_rope_scaling_orig_ctx_len(256)
        w.add_rope_dimension_count(rot_dims)
        w.add_rope_freq_base(10000.0)
        w.add_sliding_window(2047)
    else:  # conversion/gemma.py: head_dim as key/value length, window, soft caps (Gemma 2 only), Gemma 3 rope base
        w.add_key_length(HEAD)
        w.add_value_length(HEAD)
        w.add_sliding_window(WINDOW)
        if arch == "gemma2":
            w.add_attn_logit_softcapping(SOFTCAP["attn_logit_softcapping"])
            w.add_final_logit_softcapping(SOFTCAP["final_logit_softcapping"])
        else:
            w.add_rope_freq_base(1_000_000.0)
        if rope_linear:  # Gemma 3 4B+: linear scaling of the global layers' rope
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope_linear)
    write_tokenizer(w, tokens, merges)
    w.add_pad_token_id(0)  # transformers' Phi-3 default (32000) is past the tiny vocabulary
    w.add_unk_token_id(0)  # transformers' Gemma tokenizer converter needs one

    def lin(name: str, n: int, k: int, qtype: Q) -> None:
        w.add_tensor(name, gguf.quants.quantize(rng.normal(0, 0.08, (n, k)).astype(np.float32), qtype),
                     raw_dtype=qtype)

    def norm(name: str, n: int = HIDDEN) -> None:  # Gemma files store 1 + w; any value is a valid RMSNorm weight
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    emb = np.random.default_rng(0).normal(0, 0.5, (vocab, HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, Q.Q8_0), raw_dtype=Q.Q8_0)
    if arch == "phi3":  # Phi-3 has its own LM head
        lin("output.weight", vocab, HIDDEN, Q.Q8_0)
    norm("output_norm.weight")
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, arr)
    for i in range(layers):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        norm(b + "ffn_norm.weight")
        if arch == "phi3":  # fused q|k|v rows and fused gate|up rows
            lin(b + "attn_qkv.weight", (HEADS + 2 * KV_HEADS) * HEAD, HIDDEN, Q.Q4_0)
            lin(b + "ffn_up.weight", 2 * FFN, HIDDEN, Q.Q4_1)
        else:
            lin(b + "attn_q.weight", HEADS * HEAD, HIDDEN, Q.Q4_0)
            lin(b + "attn_k.weight", KV_HEADS * HEAD, HIDDEN, Q.Q4_1)
            lin(b + "attn_v.weight", KV_HEADS * HEAD, HIDDEN, Q.Q8_0)
            lin(b + "ffn_gate.weight", FFN, HIDDEN, Q.Q4_1)
            lin(b + "ffn_up.weight", FFN, HIDDEN, Q.Q4_0)
            norm(b + "post_attention_norm.weight")
            norm(b + "post_ffw_norm.weight")
        if arch == "gemma3":
            norm(b + "attn_q_norm.weight", HEAD)
            norm(b + "attn_k_norm.weight", HEAD)
        lin(b + "attn_output.weight", HIDDEN, HEADS * HEAD, Q.Q4_0)
        lin(b + "ffn_down.weight", HIDDEN, FFN, Q.Q8_0)
    finish(w)
    return path


def _hf_logits(path: Path, ids: list[int], **overrides: object) -> np.ndarray:
    """transformers on the same file. Its GGUF loader reads neither Gemma's soft caps nor its attention scale
    (it keeps config defaults: 50 / 30 and query_pre_attn_scalar 256); the file's values (what llama.cpp uses)
    are passed here, as ``overrides`` can change them to show they matter."""
    import torch
    from transformers import AutoModelForCausalLM

    kw: dict[str, object] = {}
    if "gemma" in path.stem:
        kw = {"query_pre_attn_scalar": HEAD, "attn_implementation": "eager"}
        if "gemma2" in path.stem:
            kw.update(SOFTCAP)
    kw.update(overrides)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32, **kw)
    assert type(model).__name__ == HF_ARCH[path.stem.split("-")[0]]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


IDS = [1, 60, 61, 300, 5, 100, 250, 2, 7, 9, 11, 40, 77, 200, 3]  # 15 tokens: well past the window of 4


@pytest.fixture(scope="module", params=[*LAYERS, *MODES])
def arch_bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(key, target GGUF, bundle); the key "ARCH[-MODE]" picks the --gguf-mode (MODES, default exact)."""
    arch, mode = request.param.split("-")[0], MODES.get(request.param, "exact")
    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    target = write_arch_gguf(root / f"{arch}-target.gguf", arch, LAYERS[arch], seed=1)
    drafter = write_arch_gguf(root / f"{arch}-drafter.gguf", arch, 1, seed=2)
    prompts = root / "prompts.txt"
    prompts.write_text("chat:hello world\nchat:what is the capital of the world\n", encoding="utf-8")
    opts = ExportOptions(trim_vocab=120, calibration=prompts, max_context=128, measure_memory=False,
                         target_quant=Quant("int4", 1), drafter_quant=Quant("int4", 4), gguf_mode=mode,
                         kv_dtype="float32")  # the reference configuration: compared with transformers below
    export_bundle(str(target), str(drafter), root / "bundle", opts, progress=None)
    return request.param, target, root / "bundle"


def _ours(out: Path) -> np.ndarray:
    m = read_manifest(out)
    return Decoder(out / m.target.graph, 64, m.target.head_size).forward(IDS, 0)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, atol=2e-4 * max(1.0, np.abs(b).max()), rtol=0))


@pytest.mark.slow
def test_arch_graph_matches_transformers(arch_bundle: tuple[str, Path, Path]) -> None:
    key, target, out = arch_bundle
    arch = key.split("-")[0]
    m = read_manifest(out)
    assert m.target.architecture == HF_ARCH[arch]
    ours, ref = _ours(out), _hf_logits(target, IDS)
    assert ours.shape == ref.shape == (len(IDS), len(_vocab()[0]))
    np.testing.assert_allclose(ours, ref, atol=2e-4 * max(1.0, np.abs(ref).max()), rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    rows = {t["name"]: t for t in m.target.tensors}
    if MODES.get(key) == "compact":  # Q4_1 as MatMulNBits with float zero points: equal up to rounding
        assert max(r["max_abs_err"] for r in m.target.tensors) < 1e-6
    else:
        assert all(r["exact"] for r in m.target.tensors)
    if arch == "phi3":  # the fused tensors are recorded once, under their GGUF names
        assert rows["blk.0.attn_qkv.weight"]["gguf_type"] == "Q4_0" and "blk.0.ffn_gate.weight" not in rows
        assert rows["output.weight (LM head)"]["gguf_type"] == "Q8_0"
        split = key == "phi3-split"  # the fused Q4_1 gate|up as d*q + block offsets, cut into gate and up
        assert (rows["blk.0.ffn_up.weight"]["onnx_op"] == "MatMulNBits+blocksum") == split


@pytest.mark.slow
@pytest.mark.parametrize("arch_bundle", ["gemma2", "gemma3"], indirect=True)
def test_gemma_special_parts_matter(arch_bundle: tuple[str, Path, Path]) -> None:
    """Without the window / the soft caps / Gemma 3's local rope base, transformers gives other logits: the
    match above depends on each of them."""
    arch, target, out = arch_bundle
    ours = _ours(out)
    assert not _close(ours, _hf_logits(target, IDS, sliding_window=4096))
    if arch == "gemma2":
        assert not _close(ours, _hf_logits(target, IDS, attn_logit_softcapping=None))
        assert not _close(ours, _hf_logits(target, IDS, final_logit_softcapping=None))
        assert np.abs(ours).max() <= SOFTCAP["final_logit_softcapping"]
    else:
        rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}
        assert not _close(ours, _hf_logits(target, IDS, rope_parameters=rope))


@pytest.mark.slow
def test_arch_greedy_speculative_equals_greedy_with_no_drafter(arch_bundle: tuple[str, Path, Path]) -> None:
    """Speculative == the engine with no drafter loaded == plain ONNX Runtime on the target graph (1-token steps,
    no IO binding), with every pass size bit-exact as export measured."""
    from benchmarks.one_distribution import PlainORT
    from edge_spec.runtime.engine import Engine

    _, _, out = arch_bundle
    m = read_manifest(out)
    assert m.target.batch_invariant_rows == 1 and m.target.pad_rows == 1
    engine = Engine.load(out, max_context=128)
    plain = Engine.load(out, max_context=128, drafting="none")
    ort_run = PlainORT(out / m.target.graph, m.target)
    cfg = {"max_new_tokens": 24, "stop_token_ids": ()}
    drafted = 0
    for prompt in ("hello world", "what is the capital of the world and the hello"):
        ar = plain.generate(prompt, cfg).token_ids
        assert list(ar) == ort_run.greedy(plain.tokenizer.encode(prompt).ids, len(ar), set()), prompt
        sd = engine.generate(prompt, cfg, draft_length=3)
        drafted += sd.stats.drafted
        assert sd.token_ids == ar, prompt
    assert drafted > 0


def test_long_context_and_partial_rotary_phi3_are_refused(tmp_path: Path) -> None:
    factors = np.ones(HEAD // 2, np.float32)
    bad = write_arch_gguf(tmp_path / "phi3-long.gguf", "phi3", 1, seed=3,
                          extra_tensors={"rope_factors_long.weight": factors, "rope_factors_short.weight": factors})
    with pytest.raises(ExportError, match=r"long-context Phi-3 \(LongRoPE.*use a 4k-context Phi-3 GGUF\.$"):
        export_bundle(str(bad), str(bad), tmp_path / "out", ExportOptions(), progress=None)
    partial = write_arch_gguf(tmp_path / "phi3-partial.gguf", "phi3", 1, seed=3, rot_dims=HEAD // 2)
    with pytest.raises(ExportError, match=r"rotates 8 of 16 head dimensions \(partial rotary"):
        export_bundle(str(partial), str(partial), tmp_path / "out", ExportOptions(), progress=None)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_gemma3_rope_scaling_applies_to_global_layers_only(tmp_path: Path) -> None:
    """A Gemma 3 4B-style file (linear rope factor 8): llama.cpp scales the global layers' rope only. transformers'
    GGUF loader ignores the scaling, so the reference gets it as a config override."""
    from edge_spec.export import own_build

    target = write_arch_gguf(tmp_path / "gemma3-scaled.gguf", "gemma3", LAYERS["gemma3"], seed=1, rope_linear=8.0)
    src = own_build.gguf_source(str(target), "target")
    graph = own_build.build(src, tmp_path / "g", 64, 1)
    ours = Decoder(graph, 64, HEAD).forward(IDS, 0)
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    ref = _hf_logits(target, IDS, rope_parameters=rope)
    np.testing.assert_allclose(ours, ref, atol=2e-4 * max(1.0, np.abs(ref).max()), rtol=0)
    assert not _close(ours, _hf_logits(target, IDS))  # unscaled: other logits


def test_gemma_hyperparameters_follow_llama_cpp() -> None:
    """The rules of llama.cpp's gemma2.cpp / gemma3.cpp for what transformers' loader does not read."""
    from edge_spec.export.gguf import _gemma_config

    def cfg(layers: int, hidden: int = 4608, heads: int = 32, head_dim: int = 128) -> dict:
        return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "head_dim": head_dim}

    big = cfg(46)  # Gemma 2 27B: scale by hidden / heads (144), not head_dim (128)
    _gemma_config("gemma2", {}, big)
    assert big["query_pre_attn_scalar"] == 144.0 and big["sliding_window"] == 4096
    assert (big["attn_logit_softcapping"], big["final_logit_softcapping"]) == (50.0, 30.0)
    assert big["layer_types"][:3] == ["sliding_attention", "full_attention", "sliding_attention"]
    small = cfg(26, 2304, 8, 256)
    _gemma_config("gemma3", {"gemma3.attention.sliding_window": 512}, small)
    assert small["query_pre_attn_scalar"] == 256.0 and small["attn_logit_softcapping"] is None
    assert [i for i, t in enumerate(small["layer_types"]) if t == "full_attention"] == [5, 11, 17, 23]
    assert small["rope_local_base_freq"] == 10000.0 and small["sliding_window"] == 512
    flags = cfg(4)
    _gemma_config("gemma3", {"gemma3.attention.sliding_window": 8,
                             "gemma3.attention.sliding_window_pattern": [True, False, False, True]}, flags)
    assert flags["layer_types"] == ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    none = cfg(6)  # a Gemma 3 written without a window: every layer global
    _gemma_config("gemma3", {}, none)
    assert set(none["layer_types"]) == {"full_attention"} and none["sliding_window"] is None


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["phi3", "gemma2", "gemma3"])
def test_distilled_drafter_of_an_arch_target(arch: str, tmp_path: Path) -> None:
    """``edge-spec distill``'s drafter format (the target's own HF class: Phi-3's fused qkv_proj / gate_up_proj,
    Gemma's four (1 + w) norms) exports on the target's embedding and matches that drafter in transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    from edge_spec.distill.drafter import build_drafter, load_drafter, save_drafter
    from edge_spec.fetch import file_sha256

    target = write_arch_gguf(tmp_path / f"{arch}-t.gguf", arch, LAYERS[arch], seed=1)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=target.name, dtype=torch.float32)
    layers_from = [0, LAYERS[arch] - 1]
    drafter = build_drafter(model, layers_from)
    with torch.no_grad():  # move the copied layers off the target's values, as training would
        drafter.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in drafter.state_dict().items()
                                 if k not in ("model.embed_tokens.weight", "lm_head.weight")}, strict=False)
    save_drafter(drafter, tmp_path / "d", {"target_sha256": file_sha256(target), "layers_from": layers_from})
    out = tmp_path / "bundle"
    # level 1: the 8-bit LM head without int8 activations; fp32 KV: the drafter is compared with transformers below
    opts = ExportOptions(trim_vocab=None, max_context=64, measure_memory=False, target_quant=Quant("int4", 1),
                         drafter_quant=Quant("fp32", 1), kv_dtype="float32")
    m = export_bundle(str(target), str(tmp_path / "d"), out, opts, progress=None)
    assert m.drafter.num_layers == 2 and (out / "target/embed.data").samefile(out / "drafter/embed.data")
    ours = Decoder(out / m.drafter.graph, 64, HEAD).forward(IDS, 0)
    with torch.no_grad():
        ref = load_drafter(tmp_path / "d", model)(torch.tensor([IDS])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=2e-4 * max(1.0, np.abs(ref).max()), rtol=0)
