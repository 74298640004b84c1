"""The manifest schema: round trip, strict validation, one-sentence errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from edge_spec.bundle import (
    SCHEMA_VERSION,
    ChatFormat,
    Manifest,
    ModelSpec,
    Quantization,
    SourceModel,
    TokenizerSpec,
    VocabTrim,
    manifest_from_json,
    read_manifest,
    write_manifest,
)
from edge_spec.errors import BundleError


def _model(graph: str, vocab: int) -> ModelSpec:
    return ModelSpec(
        graph=graph, data_files=(graph + ".data",), architecture="LlamaForCausalLM",
        quantization=Quantization("int4", block_size=32, accuracy_level=4), num_layers=2,
        num_attention_heads=4, num_kv_heads=2, head_size=32, hidden_size=128, vocab_size=vocab,
        full_vocab_size=8192, max_context=2048, weight_bytes=1000, load_bytes=2000,
        kv_bytes_per_token=2 * 2 * 2 * 32 * 4, workspace_bytes={1: 100, 2: 150, 4: 250},
        input_names={"input_ids": "input_ids"}, output_names={"logits": "logits"},
    )


def make_manifest() -> Manifest:
    return Manifest(
        target=_model("target/model.onnx", 8192),
        drafter=_model("drafter/model.onnx", 1024),
        tokenizer=TokenizerSpec(files=("tokenizer/tokenizer.json",), vocab_size=8192, bos_token_id=None,
                                stop_token_ids=(4, 0), special_token_ids=(0, 1, 2, 3, 4),
                                chat=ChatFormat(roles={"user": ("<|user|>\n", "<|end|>\n")},
                                                generation_prompt="<|assistant|>\n")),
        vocab_trim=VocabTrim(id_map="drafter/id_map.npy", kept=1024, full=8192, coverage=0.99,
                             calibration_tokens=5000, lm_head_bytes_before=10, lm_head_bytes_after=2),
        sources={"target": SourceModel("models/demo/target", "ab" * 32)},
        created_by="edge-spec test", created_at="2026-11-21T00:00:00Z",
    )


def _write_bundle(root: Path, m: Manifest) -> None:
    from edge_spec.bundle import bundle_files

    for rel in bundle_files(m):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    write_manifest(root, m)


def test_round_trip(tmp_path: Path) -> None:
    m = make_manifest()
    _write_bundle(tmp_path, m)
    assert read_manifest(tmp_path) == m


def test_workspace_extrapolates_linearly() -> None:
    spec = _model("g", 10)
    assert spec.workspace_for(2) == 150
    assert spec.workspace_for(1) == 100
    # measured up to 4; no k=3 entry -> slope from the top entry only is unknown, so it stays flat-or-up
    assert spec.workspace_for(8) >= spec.workspace_for(4)


@pytest.mark.parametrize(
    ("mutate", "phrase"),
    [
        (lambda d: d.update(version=SCHEMA_VERSION + 1), "upgrade edge-spec"),
        (lambda d: d.update(format="other"), "not an edge-spec manifest"),
        (lambda d: d["target"].update(bogus=1), "unknown key 'bogus'"),
        (lambda d: d["target"].pop("num_layers"), "missing 'target.num_layers'"),
        (lambda d: d.update(target=[]), "should be an object"),
        (lambda d: d.update(drafting="fastest"), "'drafting' is \"fastest\", not one of hybrid, model, lookup"),
    ],
)
def test_bad_manifests_give_one_sentence(mutate, phrase: str) -> None:
    data = json.loads(json.dumps(make_manifest().to_json()))
    mutate(data)
    with pytest.raises(BundleError) as err:
        manifest_from_json(data)
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_missing_paths_and_files(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        read_manifest(tmp_path / "nope")
    with pytest.raises(BundleError, match="has no edge_spec.json"):
        read_manifest(tmp_path)
    (tmp_path / "edge_spec.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        read_manifest(tmp_path)
    m = make_manifest()
    _write_bundle(tmp_path, m)
    (tmp_path / "drafter" / "id_map.npy").unlink()
    with pytest.raises(BundleError, match="missing 'drafter/id_map.npy'"):
        read_manifest(tmp_path)


def test_no_drafter_bundle(tmp_path: Path) -> None:
    m = replace(make_manifest(), drafter=None, vocab_trim=None)
    _write_bundle(tmp_path, m)
    assert read_manifest(tmp_path).drafter is None


def test_kv_dtype_and_shared_initializers_round_trip_and_validate(tmp_path: Path) -> None:
    from edge_spec.bundle import SharedInitializer

    m = make_manifest()
    q16 = replace(m.target.quantization, kv_dtype="float16")
    m = replace(m, target=replace(m.target, quantization=q16, kv_bytes_per_token=2 * 2 * 2 * 32 * 2),
                shared_initializers=(SharedInitializer("embed.scales", "target/embed.data", 64, 8192 * 4 * 4,
                                                       "float32", (8192, 4)),))
    _write_bundle(tmp_path, m)
    assert read_manifest(tmp_path) == m
    data = json.loads((tmp_path / "edge_spec.json").read_text())
    bad_kv = json.loads(json.dumps(data))
    bad_kv["target"]["kv_bytes_per_token"] = 2 * 2 * 2 * 32 * 4  # fp32 bytes for an fp16 cache
    with pytest.raises(BundleError, match="kv_bytes_per_token"):
        manifest_from_json(bad_kv)
    bad_shape = json.loads(json.dumps(data))
    bad_shape["shared_initializers"][0]["shape"] = [8192, 5]
    with pytest.raises(BundleError, match="do not make"):
        manifest_from_json(bad_shape)
    old = json.loads(json.dumps(data))
    del old["shared_initializers"]
    del old["target"]["quantization"]["kv_dtype"]
    old["target"]["kv_bytes_per_token"] = 2 * 2 * 2 * 32 * 4
    loaded = manifest_from_json(old)  # a manifest written before these fields: fp32 KV, nothing shared
    assert loaded.shared_initializers == () and loaded.target.quantization.kv_cache_dtype == "float32"
