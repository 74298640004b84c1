"""GGUF in: tiny random llama and qwen2 GGUF files (written here with gguf.GGUFWriter, Q4_0/Q4_1/Q8_0 tensors and a
real byte-level BPE tokenizer) export with their own quantization, match transformers on the same file, and run
through the Engine with greedy speculative == greedy AR."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import read_manifest
from edge_spec.errors import ExportError
from edge_spec.export.measure import Decoder
from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS, HEAD = 64, 128, 4, 2, 16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ["the", "and", "hello", "world", "def", "return", "is", "of", "to", "in", "print", "capital", "what"]


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (the alphabet of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def _vocab(specials: list[str] = SPECIALS) -> tuple[list[str], list[str]]:
    """``specials`` (3 special tokens) + 256 bytes + merges building a few whole words (with and without a leading
    space)."""
    tokens = specials + _byte_chars()
    merges: list[str] = []
    have = set(tokens)
    for word in WORDS:
        for w in (word, "Ġ" + word):
            cur = w[0]
            for ch in w[1:]:
                if cur + ch not in have:
                    merges.append(f"{cur} {ch}")
                    tokens.append(cur + ch)
                    have.add(cur + ch)
                cur += ch
    return tokens, merges


def _head(arch: str) -> int:
    """Qwen3 GGUFs carry head_dim as attention.key_length, which transformers' loader ignores (it keeps
    Qwen3's default 128), so the tiny qwen3 uses 128."""
    return 128 if arch == "qwen3" else HEAD


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rows -> llama.cpp's interleaved-rope row order (what convert_hf_to_gguf.py writes for llama)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_header(w: gguf.GGUFWriter, layers: int, hidden: int = HIDDEN, ffn: int = FFN, heads: int = HEADS,
                 kv_heads: int = KV_HEADS) -> None:
    """The hyperparameters every tiny test GGUF shares (sizes from this module's constants unless given)."""
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)


def write_tokenizer(w: gguf.GGUFWriter, tokens: list[str], merges: list[str], n_special: int = len(SPECIALS)) -> None:
    """The byte-level BPE vocabulary (its first ``n_special`` tokens control tokens), special ids and ChatML template
    every tiny test GGUF shares."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * n_special + [1] * (len(tokens) - n_special))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)


def finish(w: gguf.GGUFWriter) -> None:
    """Write the header, key-values and tensors, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def assert_greedy_sd_equals_ar(engine, max_new_tokens: int) -> None:
    """Greedy speculative (draft length 3) == greedy decoding of the same bundle loaded with no drafter, on three
    prompts, with drafts made."""
    from edge_spec.runtime.engine import Engine

    plain = Engine.load(engine.bundle_dir, drafting="none", max_context=engine.plan.max_context)
    assert plain.drafter is None
    cfg = {"max_new_tokens": max_new_tokens, "stop_token_ids": ()}
    drafted = 0
    for prompt in ("hello world", "def hello():\n", "what is the capital"):
        ar = plain.generate(prompt, cfg).token_ids
        sd = engine.generate(prompt, cfg, draft_length=3)
        drafted += sd.stats.drafted
        assert sd.token_ids == ar, prompt
    assert drafted > 0


def write_tiny_gguf(path: Path, arch: str, layers: int, seed: int, embed_seed: int = 0, embed_type: Q = Q.Q8_0,
                    head_type: Q | None = None, specials: list[str] = SPECIALS,
                    kv: dict[str, int] | None = None, layer_type: Q | None = None) -> Path:
    """A random ``arch`` (llama | qwen2 | qwen3) decoder as GGUF: tied Q8_0 embedding, Q4_0/Q4_1/Q8_0 linear layers
    (``layer_type``: all of them that type, as SmolLM2-135M's Q4_1 file); ``specials``: its control tokens (the first
    three as SPECIALS), ``kv``: more uint32 metadata."""
    tokens, merges = _vocab(specials)
    vocab = len(tokens)
    head = _head(arch)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    write_header(w, layers)
    w.add_rope_freq_base(10000.0)
    if arch == "llama":
        w.add_rope_dimension_count(HEAD)
    if arch == "qwen3":  # as llama.cpp's converter writes it
        w.add_key_length(head)
        w.add_value_length(head)
    write_tokenizer(w, tokens, merges, len(specials))
    for key, value in (kv or {}).items():
        w.add_uint32(key, value)

    def lin(name: str, n: int, k: int, qtype: Q, permute_heads: int = 0) -> None:
        m = rng.normal(0, 0.08, (n, k)).astype(np.float32)
        if permute_heads and arch == "llama":
            m = _permute(m, permute_heads)
        qtype = layer_type or qtype
        w.add_tensor(name, gguf.quants.quantize(m, qtype), raw_dtype=qtype)

    emb = np.random.default_rng(embed_seed).normal(0, 0.5, (vocab, HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, embed_type), raw_dtype=embed_type)
    if head_type is not None:  # an untied LM head (Qwen2.5-Coder-1.5B: Q4_K embedding, Q6_K output)
        out = rng.normal(0, 0.5, (vocab, HIDDEN)).astype(np.float32)
        w.add_tensor("output.weight", gguf.quants.quantize(out, head_type), raw_dtype=head_type)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    # llama: q/k/v of three different types (separate MatMulNBits); qwen2: one type (fused qkv + bias)
    qkv = (Q.Q4_0, Q.Q4_1, Q.Q8_0) if arch == "llama" else (Q.Q4_1, Q.Q4_1, Q.Q4_1)
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        w.add_tensor(b + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        lin(b + "attn_q.weight", HEADS * head, HIDDEN, qkv[0], HEADS)
        lin(b + "attn_k.weight", KV_HEADS * head, HIDDEN, qkv[1], KV_HEADS)
        lin(b + "attn_v.weight", KV_HEADS * head, HIDDEN, qkv[2])
        if arch == "qwen3":  # per-head RMSNorm of q and k before rope
            w.add_tensor(b + "attn_q_norm.weight", (1 + 0.1 * rng.standard_normal(head)).astype(np.float32))
            w.add_tensor(b + "attn_k_norm.weight", (1 + 0.1 * rng.standard_normal(head)).astype(np.float32))
        if arch == "qwen2":
            for nm, n in (("q", HEADS * HEAD), ("k", KV_HEADS * HEAD), ("v", KV_HEADS * HEAD)):
                w.add_tensor(f"{b}attn_{nm}.bias", rng.normal(0, 0.1, n).astype(np.float32))
        lin(b + "attn_output.weight", HIDDEN, HEADS * head, Q.Q4_0)
        lin(b + "ffn_gate.weight", FFN, HIDDEN, Q.Q4_1)
        lin(b + "ffn_up.weight", FFN, HIDDEN, Q.Q4_0)
        lin(b + "ffn_down.weight", HIDDEN, FFN, Q.Q8_0)
    finish(w)
    return path


def _hf_logits(path: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


MODES = {"llama": "exact", "qwen2": "compact", "qwen3": "exact", "qwen2-split": "split", "llama-split": "split"}


@pytest.fixture(scope="module", params=list(MODES))
def gguf_bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(arch, target GGUF, bundle); request.param "ARCH[-MODE]" picks the --gguf-mode (MODES)."""
    arch, mode = request.param.split("-")[0], MODES[request.param]
    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    target = write_tiny_gguf(root / "target.gguf", arch, 2, seed=1)
    drafter = write_tiny_gguf(root / "drafter.gguf", arch, 1, seed=2)
    prompts = root / "prompts.txt"
    prompts.write_text("chat:hello world\nchat:what is the capital of the world\ndef hello():\\n\n", encoding="utf-8")
    out = root / "bundle"
    # qwen2: the compact encoding (MatMulNBits with float zero points for Q4_1); split: Q4_1 as d*q + block offsets
    opts = ExportOptions(trim_vocab=120, calibration=prompts, max_context=128, measure_memory=False,
                         target_quant=Quant("int4", 1), drafter_quant=Quant("int4", 4), gguf_mode=mode,
                         kv_dtype="float32")  # the reference configuration: compared with transformers below
    export_bundle(str(target), str(drafter), out, opts, progress=None)
    return request.param, target, out


@pytest.mark.slow
def test_gguf_graph_matches_transformers_on_the_same_file(gguf_bundle: tuple[str, Path, Path]) -> None:
    key, target, out = gguf_bundle
    arch = key.split("-")[0]
    m = read_manifest(out)
    assert m.target.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                     "qwen3": "Qwen3ForCausalLM"}[arch]
    ids = [1, 60, 61, 300, 5, 100, 250, 2, 7, 9, 11, 40]
    ours = Decoder(out / m.target.graph, 64, m.target.head_size).forward(ids, 0)
    ref = _hf_logits(target, ids)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=2e-4 * max(1.0, np.abs(ref).max()), rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.slow
def test_gguf_manifest_records_each_tensor(gguf_bundle: tuple[str, Path, Path]) -> None:
    key, _, out = gguf_bundle
    m = read_manifest(out)
    rows = {t["name"]: t for t in m.target.tensors}
    assert len(m.target.tensors) == 2 + 2 * 7
    assert rows["token_embd.weight"]["gguf_type"] == "Q8_0" and rows["token_embd.weight"]["exact"]
    o = rows["blk.1.attn_output.weight"]
    assert (o["gguf_type"], o["exact"], o["onnx_op"], o["bits"]) == ("Q4_0", True, "MatMulNBits", 4)
    head, down, gate = rows["token_embd.weight (LM head)"], rows["blk.0.ffn_down.weight"], rows["blk.0.ffn_gate.weight"]
    assert down["gguf_type"] == "Q8_0" and down["exact"] and gate["gguf_type"] == "Q4_1"
    if MODES[key] == "split":  # Q4_1 as MatMulNBits (integer zero points) + block offsets: exact, fast kernels
        assert (gate["onnx_op"], gate["bits"], gate["exact"], gate["max_abs_err"]) == ("MatMulNBits+blocksum", 4,
                                                                                       True, 0.0)
        assert head["onnx_op"] == "MatMul (fp32 of the exact values)" and all(r["exact"] for r in m.target.tensors)
        import onnx  # q/k/v (qwen2: all Q4_1) and gate/up (llama: Q4_1 + Q4_0, different encodings) fused or not

        g = onnx.load(str(out / m.target.graph), load_external_data=False).graph
        names = {n.name for n in g.node}
        fused_qkv = key == "qwen2-split"
        assert ("/model/layers.0/attn/qkv_proj/MatMulNBits" in names) == fused_qkv
        assert ("/model/layers.0/mlp/gate_proj/MatMulNBits" in names) and "/model/layers.0/mlp/up_proj" in names
        # the mask's, then one block sum per layer input feeding a split weight (shared by q/k/v): 2 layers x 2
        assert sum(n.op_type == "ReduceSum" for n in g.node) == 1 + 2 * 2
    elif key == "qwen2":  # compact: the file's blocks in MatMulNBits, at accuracy_level 1 too
        assert (head["onnx_op"], head["bits"], head["block"], head["exact"]) == ("MatMulNBits", 8, 32, True)
        assert gate["bits"] == 4 and gate["max_abs_err"] < 1e-6
    else:  # exact: 8-bit at level 1 and float zero points would hit ORT's slow fallbacks -> fp32 of the same values
        assert (head["onnx_op"], head["bits"], head["exact"]) == ("MatMul (fp32 of the exact values)", 32, True)
        assert (gate["bits"], gate["exact"]) == (32, True) and all(r["exact"] for r in m.target.tensors)
    # the trimmed drafter: head rows = kept ids, embedding stored once (same bytes as the target's)
    assert m.drafter.vocab_size == m.vocab_trim.kept == 120
    d_head = {t["name"]: t for t in m.drafter.tensors}["token_embd.weight (LM head)"]
    assert d_head["onnx_op"] == "MatMulNBits (VocabTrim rows)" and d_head["bits"] == 8 and d_head["exact"]
    shared = m.notes.get("shared_embedding")
    assert shared and (out / "target/embed.data").samefile(out / "drafter/embed.data") == shared["hard_link"]
    assert m.sources["target"].sha256 and len(m.sources["target"].sha256) == 64
    assert 2 in m.tokenizer.stop_token_ids and m.tokenizer.chat is not None


@pytest.mark.slow
def test_gguf_bundle_greedy_speculative_equals_ar(gguf_bundle: tuple[str, Path, Path]) -> None:
    from edge_spec.runtime.engine import Engine

    _, _, out = gguf_bundle
    assert_greedy_sd_equals_ar(Engine.load(out, max_context=128), 24)


def test_gguf_errors_are_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ExportError, match="GGUF magic"):
        export_bundle(str(bad), str(bad), tmp_path / "out", ExportOptions(), progress=None)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 12)
    with pytest.raises(ExportError, match="not a readable GGUF"):
        export_bundle(str(trunc), str(trunc), tmp_path / "out", ExportOptions(), progress=None)
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ExportError, match="architecture 'phi2' is not supported.*llama, mistral, qwen2"):
        export_bundle(str(tmp_path / "phi.gguf"), str(tmp_path / "phi.gguf"), tmp_path / "out", ExportOptions(),
                      progress=None)
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", 1, seed=1)
    with pytest.raises(ExportError, match="one graph from a GGUF for every provider.*--device"):
        export_bundle(str(tiny), None, tmp_path / "out", ExportOptions(execution_provider="webgpu"), progress=None)
    assert not (tmp_path / "out").exists()


def _distilled_dir(path: Path, target_sha: str, layers: int = 1) -> Path:
    """An edge-spec distilled drafter: HF llama tensors without embedding / LM head, pointing at its target."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    path.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
           "intermediate_size": FFN, "num_hidden_layers": layers, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "head_dim": HEAD, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 256, "tie_word_embeddings": True,
           "edge_spec_drafter": {"shares_target_embedding": True, "target_sha256": target_sha}}
    (path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    sd = {"model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for nm, shape in (("self_attn.q_proj", (HEADS * HEAD, HIDDEN)), ("self_attn.k_proj", (KV_HEADS * HEAD, HIDDEN)),
                          ("self_attn.v_proj", (KV_HEADS * HEAD, HIDDEN)), ("self_attn.o_proj", (HIDDEN, HIDDEN)),
                          ("mlp.gate_proj", (FFN, HIDDEN)), ("mlp.up_proj", (FFN, HIDDEN)),
                          ("mlp.down_proj", (HIDDEN, FFN))):
            sd[p + nm + ".weight"] = rng.normal(0, 0.08, shape).astype(np.float32)
        sd[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        sd[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    save_file(sd, str(path / "model.safetensors"))
    return path


@pytest.mark.slow
def test_distilled_drafter_shares_the_target_embedding(tmp_path: Path) -> None:
    from edge_spec.fetch import file_sha256
    from edge_spec.runtime.engine import Engine

    target = write_tiny_gguf(tmp_path / "t.gguf", "llama", 2, seed=1)
    wrong = _distilled_dir(tmp_path / "wrong", "0" * 64)
    with pytest.raises(ExportError, match="distilled from a target with sha256 000000000000"):
        export_bundle(str(target), str(wrong), tmp_path / "o", ExportOptions(), progress=None)
    drafter = _distilled_dir(tmp_path / "d", file_sha256(target))
    out = tmp_path / "bundle"
    opts = ExportOptions(trim_vocab=None, max_context=64, measure_memory=False, drafter_quant=Quant("int8", 4))
    m = export_bundle(str(target), str(drafter), out, opts, progress=None)
    rows = {t["name"]: t for t in m.drafter.tensors}
    assert rows["token_embd.weight (LM head)"]["exact"] and rows["token_embd.weight"]["exact"]
    assert rows["model.layers.0.mlp.up_proj.weight"]["bits"] == 8
    assert not rows["model.layers.0.mlp.up_proj.weight"]["exact"]
    assert m.drafter.quantization.precision == "int8" and m.drafter.num_layers == 1
    default = export_bundle(str(target), str(drafter), tmp_path / "b4", ExportOptions(
        trim_vocab=None, max_context=64, measure_memory=False), progress=None)
    assert default.drafter.quantization.precision == "int4"  # a layer drafter's default (an EAGLE-3 head's: int8)
    assert (out / "target/embed.data").samefile(out / "drafter/embed.data")
    # the drafter's logits: its embedding and LM head are the target's, bit for bit in the graph
    d = Decoder(out / m.drafter.graph, 32, HEAD).forward([1, 60, 61], 0)
    assert d.shape == (3, m.target.vocab_size) and np.isfinite(d).all()
    engine = Engine.load(out, max_context=64)
    cfg = {"max_new_tokens": 12, "stop_token_ids": ()}
    assert engine.generate("hello", cfg, draft_length=2).token_ids == engine.generate(
        "hello", cfg, speculative=False).token_ids


@pytest.mark.slow
def test_builder_keeps_the_lm_head_at_int8(tmp_path: Path) -> None:
    import onnx

    from edge_spec.export.build import BuildOptions, build_graph, resolve_checkpoint

    ckpt = resolve_checkpoint(str(Path(__file__).resolve().parents[1] / "models" / "demo" / "target"), "target")
    graph = build_graph(ckpt, tmp_path / "g", BuildOptions("int4", 1, lm_head="int8"), tmp_path / "cache")
    nodes = onnx.load(str(graph), load_external_data=False).graph.node
    bits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in nodes if n.op_type == "MatMulNBits"}
    head = next(n.name for n in nodes if "logits" in n.output)
    assert bits.pop(head) == 8 and set(bits.values()) == {4}


@pytest.mark.slow
def test_float_offset_embedding_keeps_its_blocks(tmp_path: Path) -> None:
    """An untied Q4_1 embedding (float offsets, as Q4_K's) is gathered from the file's own codes and decoded in
    the graph: exact, a quarter of float32's bytes, and the logits still transformers' on the same file."""
    target = write_tiny_gguf(tmp_path / "t.gguf", "llama", 2, seed=1, embed_type=Q.Q4_1, head_type=Q.Q8_0)
    out = tmp_path / "bundle"
    opts = ExportOptions(trim_vocab=None, max_context=64, measure_memory=False, gguf_mode="split",
                         target_quant=Quant("int4", 1), kv_dtype="float32")  # the reference configuration
    m = export_bundle(str(target), None, out, opts, progress=None)
    rows = {t["name"]: t for t in m.target.tensors}
    emb = rows["token_embd.weight"]
    assert (emb["gguf_type"], emb["onnx_op"], emb["bits"], emb["exact"]) == (
        "Q4_1", "Gather+decode (the file's codes and offsets)", 4, True)
    vocab = m.target.vocab_size
    assert emb["bytes"] == vocab * HIDDEN // 2 + 2 * 4 * vocab * HIDDEN // 32  # codes + fp32 scales and offsets
    assert (out / "target/embed.data").stat().st_size == emb["bytes"]
    assert rows["output.weight (LM head)"]["exact"]
    ids = [1, 60, 61, 300, 5, 100, 250, 2, 7, 9, 11, 40]
    ours = Decoder(out / m.target.graph, 64, m.target.head_size).forward(ids, 0)
    ref = _hf_logits(target, ids)
    np.testing.assert_allclose(ours, ref, atol=2e-4 * max(1.0, np.abs(ref).max()), rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
