"""Shared fixtures: the demo bundle, exported once and cached across sessions.

The cache key covers the demo checkpoints and the exporter's source, so a change to either
re-exports; the bundle lives in ``.cache/test-bundles/<key>`` (git-ignored)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"


def _key() -> str:
    from edge_spec.export.pipeline import checkpoint_sha256

    h = hashlib.sha256()
    for role in ("target", "drafter"):
        h.update(checkpoint_sha256(DEMO / role).encode())
        h.update((DEMO / role / "tokenizer.json").read_bytes())
    for src in sorted((ROOT / "edge_spec" / "export").glob("*.py")) + [ROOT / "edge_spec" / "bundle.py"]:
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def demo_bundle() -> Path:
    """The demo target + drafter exported with default options (trimmed drafter); returns the bundle dir."""
    from edge_spec.bundle import MANIFEST_NAME
    from edge_spec.export.pipeline import ExportOptions, export_bundle

    out = ROOT / ".cache" / "test-bundles" / _key()
    if not (out / MANIFEST_NAME).is_file():
        export_bundle(str(DEMO / "target"), str(DEMO / "drafter"), out, ExportOptions(force=True), progress=None)
    return out
