"""Every user error of `edge-spec export`: one sentence on stderr, non-zero exit, nothing left behind."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from edge_spec.cli import main
from edge_spec.export import pipeline

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
T, D = str(DEMO / "target"), str(DEMO / "drafter")


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    rc = main(["export", *argv])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert rc != 0
    assert "Traceback" not in err
    assert last.startswith("edge-spec: error: ")
    for n in needles:
        assert n in last, last
    return err


def _copy(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_missing_path(capsys, tmp_path: Path) -> None:
    err = _fails(capsys, ["--target", str(tmp_path / "nope"), "--drafter", D, "--out", str(tmp_path / "b")],
                 "does not exist")
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_directory_that_is_not_a_checkpoint(capsys, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _fails(capsys, ["--target", str(tmp_path / "empty"), "--drafter", D, "--out", str(tmp_path / "b")],
           "no config.json")


def test_unsupported_architecture_lists_supported(capsys, tmp_path: Path) -> None:
    ck = _copy(T, tmp_path / "gpt2")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (ck / "config.json").write_text(json.dumps(cfg))
    _fails(capsys, ["--target", str(ck), "--drafter", D, "--out", str(tmp_path / "b")],
           "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM")


def test_remote_code_needs_flag(capsys, tmp_path: Path) -> None:
    ck = _copy(D, tmp_path / "remote")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (ck / "config.json").write_text(json.dumps(cfg))
    _fails(capsys, ["--target", T, "--drafter", str(ck), "--out", str(tmp_path / "b")], "--trust-remote-code")


def test_tokenizer_mismatch_names_first_difference(capsys, tmp_path: Path) -> None:
    ck = _copy(D, tmp_path / "other-tok")
    tok = json.loads((ck / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    victim = next(t for t, i in vocab.items() if i == 1234)
    vocab["zzz_not_a_token"] = vocab.pop(victim)
    (ck / "tokenizer.json").write_text(json.dumps(tok))
    _fails(capsys, ["--target", T, "--drafter", str(ck), "--out", str(tmp_path / "b")],
           "vocabulary at id 1234", "zzz_not_a_token")


def test_tokenizer_mismatch_in_normalizer(capsys, tmp_path: Path) -> None:
    ck = _copy(D, tmp_path / "norm")
    tok = json.loads((ck / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "Lowercase"}
    (ck / "tokenizer.json").write_text(json.dumps(tok))
    _fails(capsys, ["--target", T, "--drafter", str(ck), "--out", str(tmp_path / "b")], "normalizer")


def test_existing_output_needs_force(capsys, tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("mine")
    _fails(capsys, ["--target", T, "--drafter", D, "--out", str(tmp_path / "b")], "--force")
    assert (tmp_path / "b" / "keep.txt").read_text() == "mine"


def test_unwritable_output(capsys, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")  # a path below a regular file can never be created (even as root)
    _fails(capsys, ["--target", T, "--drafter", D, "--out", str(tmp_path / "file" / "b")], "Cannot write")


def test_hub_id_without_network(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fails(capsys, ["--target", "no-such-org/no-such-model", "--drafter", D, "--out", str(tmp_path / "b")],
           "no-such-org/no-such-model", "downloading")


def test_bad_options(capsys, tmp_path: Path) -> None:
    _fails(capsys, ["--target", T, "--drafter", D, "--out", str(tmp_path / "b"), "--trim-vocab", "lots"], "K")
    _fails(capsys, ["--target", T, "--drafter", D, "--out", str(tmp_path / "b"), "--quant", "fp16"], "fp16")
    _fails(capsys, ["--target", T, "--drafter", D, "--out", str(tmp_path / "b"), "--quant", "int3"], "int3")
    _fails(capsys, ["--target", T, "--out", str(tmp_path / "b"), "--default-drafting", "model"],
           "--default-drafting model drafts with the drafter model", "--default-drafting lookup")
    assert not (tmp_path / "b").exists()


def test_disk_full_cleans_up(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pipeline.build, "build_graph", full)
    _fails(capsys, ["--target", T, "--drafter", D, "--out", str(tmp_path / "b")], "disk", "full")
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path) == []


def test_interrupted_export_leaves_nothing(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pipeline.build.build_graph
    calls = []

    def build_then_interrupt(ckpt, out_dir, opts, cache):
        calls.append(real(ckpt, out_dir, opts, cache))  # a real graph lands in the temp dir first
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.build, "build_graph", build_then_interrupt)
    rc = main(["export", "--target", D, "--drafter", D, "--out", str(tmp_path / "b")])
    assert rc == 130 and calls and "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path) == []
