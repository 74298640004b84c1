"""VocabTrim's calibration: samples of the target graph, batched, whose tokens do not depend on their batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_spec.bundle import read_manifest
from edge_spec.export.build import BuildOptions, build_graph, resolve_checkpoint
from edge_spec.export.calibrate import target_token_counts

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def add(a, b):\n", "chat:Hello there", "for i in range(3):\n"]


def test_samples_do_not_depend_on_the_rows_beside_them(demo_bundle: Path, tmp_path: Path) -> None:
    # the demo target's graph as the pipeline calibrates on it: int4 at int8 activations, before pad_rows
    target = resolve_checkpoint(str(ROOT / "models" / "demo" / "target"), "target")
    graph = build_graph(target, tmp_path / "target", BuildOptions("int4", 4, max_context=256), tmp_path / "cache")
    m = read_manifest(demo_bundle)
    args = (graph, m.target.head_size, demo_bundle / m.tokenizer.files[0], m.tokenizer.chat)
    kw = {"max_new_tokens": 24, "samples_per_prompt": 3}
    free = target_token_counts(*args, PROMPTS, **kw)
    assert free.sum() == len(PROMPTS) * 3 * 24  # no stop token: every sample writes all its tokens
    # the target's most frequent token as a stop token: samples finish at different steps and leave the batch,
    # the live rows' caches moving up; each sample must still write what it writes in a batch of its prompt alone
    stop = (int(np.argmax(free)),)
    together = target_token_counts(*args, PROMPTS, stop_ids=stop, **kw)
    alone = sum(target_token_counts(*args, [p], stop_ids=stop, **kw) for p in PROMPTS)
    assert 0 < together[stop[0]] and together.sum() < free.sum()
    np.testing.assert_array_equal(together, alone)
    # and the same prompts in another order: the same counts (each sample's random stream is its own)
    np.testing.assert_array_equal(target_token_counts(*args, PROMPTS[::-1], stop_ids=stop, **kw), together)
