"""Export of the demo pair and of a tiny Qwen2 pair: manifest, VocabTrim, ORT GenAI loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import manifest_from_json, read_manifest
from edge_spec.export.build import BuildOptions, build_graph, resolve_checkpoint
from edge_spec.export.measure import Decoder
from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle
from edge_spec.export.vocab_trim import choose_kept, to_draft_ids, trim_lm_head

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
TOKENS = [5, 17, 300, 42, 1000, 7, 99, 2048, 11, 64]


def test_demo_manifest_round_trips(demo_bundle: Path) -> None:
    m = read_manifest(demo_bundle)
    assert manifest_from_json(json.loads(json.dumps(m.to_json()))) == m
    assert m.target.vocab_size == m.target.full_vocab_size == 8192
    assert m.drafter.vocab_size == m.vocab_trim.kept < 8192
    assert m.vocab_trim.lm_head_bytes_after < m.vocab_trim.lm_head_bytes_before
    assert m.vocab_trim.coverage >= 0.99
    assert sorted(m.target.workspace_bytes) == list(range(1, 17))
    assert m.target.load_bytes > 0 and m.target.weight_bytes > 0
    assert m.target.kv_bytes_per_token == 2 * 6 * 4 * 32 * 4
    assert m.target.quantization.accuracy_level == 1 and m.drafter.quantization.accuracy_level == 4
    assert {0, 4} <= set(m.tokenizer.stop_token_ids)
    assert m.tokenizer.chat.roles["user"] == ("<|user|>\n", "<|end|>\n")
    assert m.tokenizer.chat.generation_prompt == "<|assistant|>\n"
    assert len(m.sources["target"].sha256) == 64


def test_demo_target_loads_in_ort_genai(demo_bundle: Path) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    assert og.Model(str(demo_bundle / "target")) is not None


def test_id_map_round_trips(demo_bundle: Path) -> None:
    m = read_manifest(demo_bundle)
    id_map = np.load(demo_bundle / m.vocab_trim.id_map)
    assert id_map.dtype == np.int32 and id_map.shape == (m.vocab_trim.kept,)
    assert np.all(np.diff(id_map) > 0)  # unique, sorted ascending
    assert set(m.tokenizer.special_token_ids) | set(m.tokenizer.stop_token_ids) <= set(id_map.tolist())
    draft = to_draft_ids(id_map, id_map)
    assert np.array_equal(draft, np.arange(len(id_map)))
    assert np.array_equal(id_map[draft], id_map)
    missing = np.setdiff1d(np.arange(8192), id_map)[:5]
    assert np.all(to_draft_ids(id_map, missing) == -1)


def test_trimmed_drafter_logits_equal_untrimmed_at_kept_ids(demo_bundle: Path, tmp_path: Path) -> None:
    m = read_manifest(demo_bundle)
    q = m.drafter.quantization
    full = build_graph(resolve_checkpoint(str(DEMO / "drafter"), "drafter"), tmp_path / "full",
                       BuildOptions(q.precision, q.accuracy_level, q.block_size), tmp_path / "cache")
    id_map = np.load(demo_bundle / m.vocab_trim.id_map)
    a = Decoder(full, 64, m.drafter.head_size).forward(TOKENS, 0)
    b = Decoder(demo_bundle / m.drafter.graph, 64, m.drafter.head_size).forward(TOKENS, 0)
    assert b.shape == (len(TOKENS), len(id_map))
    np.testing.assert_allclose(b, a[:, id_map], rtol=1e-5, atol=1e-5)


def test_choose_kept_fixed_k_and_auto() -> None:
    counts = np.zeros(100, dtype=np.int64)
    counts[[10, 20, 30, 40]] = [50, 30, 15, 5]
    fixed = choose_kept(counts, 6, always_keep=(0, 1))
    assert fixed.ids.tolist() == [0, 1, 10, 20, 30, 40]
    auto = choose_kept(counts, "auto", always_keep=(0,), share=0.9)
    assert auto.ids.tolist() == [0, 10, 20, 30] and auto.coverage == pytest.approx(0.95)


# ------------------------------------------------------------------------------ tiny Qwen2
def _tiny_qwen2(path: Path, layers: int, seed: int) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=[4, 0], pad_token_id=0)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)  # tied: sharper logits than the 0.02 init
    model.save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(DEMO / "target" / f, path / f)
    return path


@pytest.fixture(scope="module")
def qwen_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("qwen2")
    return _tiny_qwen2(root / "target", 2, 0), _tiny_qwen2(root / "drafter", 1, 1)


def test_qwen2_pair_exports_and_trims_fp32_head(qwen_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, drafter = qwen_pair
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("chat:Hello there\ndef add(a, b):\\n\n", encoding="utf-8")
    out = tmp_path / "bundle"
    opts = ExportOptions(target_quant=Quant("int4", 1), drafter_quant=Quant("fp32"), trim_vocab=512,
                         calibration=prompts, max_context=128)
    m = export_bundle(str(target), str(drafter), out, opts, progress=None)
    assert read_manifest(out) == m
    assert m.target.architecture == m.drafter.architecture == "Qwen2ForCausalLM"
    assert m.drafter.vocab_size == m.vocab_trim.kept == 512 and m.target.max_context == 128
    id_map = np.load(out / m.vocab_trim.id_map)
    full = build_graph(resolve_checkpoint(str(drafter), "drafter"), tmp_path / "full", BuildOptions("fp32"),
                       tmp_path / "cache")
    a = Decoder(full, 32, m.drafter.head_size).forward(TOKENS, 0)
    b = Decoder(out / m.drafter.graph, 32, m.drafter.head_size).forward(TOKENS, 0)
    np.testing.assert_allclose(b, a[:, id_map], rtol=1e-5, atol=1e-5)


def test_trim_lm_head_int4_rows(qwen_pair: tuple[Path, Path], tmp_path: Path) -> None:
    _, drafter = qwen_pair
    graph = build_graph(resolve_checkpoint(str(drafter), "drafter"), tmp_path / "g", BuildOptions("int4", 1),
                        tmp_path / "cache")
    a = Decoder(graph, 32, 16).forward(TOKENS, 0)
    kept = np.array([0, 1, 2, 3, 4, 77, 500, 8191], dtype=np.int32)
    before, after = trim_lm_head(graph, kept)
    assert after < before
    b = Decoder(graph, 32, 16).forward(TOKENS, 0)
    np.testing.assert_allclose(b, a[:, kept], rtol=1e-5, atol=1e-5)
