"""Weights target and drafter share (the embedding) are mapped once and given to both sessions; the
drafter's load_bytes are measured next to the loaded target, as the runtime loads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import read_manifest
from edge_spec.export.measure import measure_memory
from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle
from tests.test_gguf_export import write_tiny_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shared")
    target = write_tiny_gguf(root / "target.gguf", "llama", 2, seed=1)
    drafter = write_tiny_gguf(root / "drafter.gguf", "llama", 1, seed=2)  # same embedding (embed_seed 0)
    opts = ExportOptions(trim_vocab=None, max_context=128, target_quant=Quant("int4", 4),
                         drafter_quant=Quant("int4", 4), gguf_mode="split")
    export_bundle(str(target), str(drafter), root / "b", opts, progress=None)
    return root / "b"


def test_manifest_lists_the_shared_embedding(bundle: Path) -> None:
    m = read_manifest(bundle)
    names = {t.name for t in m.shared_initializers}
    assert names and all(n.startswith("embed.") for n in names)
    data = (bundle / "target/embed.data").read_bytes()
    for t in m.shared_initializers:
        assert t.file == "target/embed.data" and t.offset + t.length <= len(data)
        assert np.prod(t.shape) * np.dtype(t.dtype).itemsize == t.length


def test_both_sessions_read_one_buffer_and_decode_as_before(bundle: Path) -> None:
    from edge_spec.runtime.engine import Engine
    from edge_spec.runtime.session import ModelSession

    engine = Engine.load(bundle, max_context=128)
    assert engine.plan.mode == "speculative"
    shared = engine.target._initializers
    assert shared and all(engine.drafter._initializers[k] is v for k, v in shared.items())
    # the shared buffer holds exactly what the graph would load itself: same logits as a session without it
    m = read_manifest(bundle)
    plain = ModelSession(bundle / m.target.graph, m.target, providers=["CPUExecutionProvider"], device="cpu",
                         capacity=32, max_rows=16)
    ids = [1, 60, 61, 300, 5, 100, 250, 2]
    engine.reset()
    np.testing.assert_array_equal(np.array(engine.target.forward(ids)), np.array(plain.forward(ids)))


def test_drafter_load_is_measured_beside_the_target(bundle: Path) -> None:
    """Alone, the first session of a process also pays ONNX Runtime's one-off set-up and its own copy of the
    embedding: that is what the manifest used to reserve for a drafter that adds far less at run time."""
    m = read_manifest(bundle)
    alone = measure_memory(bundle / m.drafter.graph, 128, m.drafter.head_size, max_k=1)["load_bytes"]  # fresh process
    assert 0 < m.drafter.load_bytes < alone
