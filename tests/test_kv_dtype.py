"""fp16 KV cache (``export --kv-dtype fp16``) and request-sized context, on a tiny GGUF pair.

fp16 KV: the graph casts q/k/v to fp16 around GroupQueryAttention and keeps the caches in fp16;
the manifest says so (``quantization.kv_dtype``), the planner counts half the KV bytes, the runtime
allocates fp16 buffers, and greedy speculative output still equals greedy plain decoding of the
same bundle (exactness holds within a graph, whatever its KV precision).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import Quantization, read_manifest
from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle
from tests.test_gguf_export import assert_greedy_sd_equals_ar, write_tiny_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two bundles of one tiny llama GGUF pair, fp32 and fp16 KV (256 positions, trimmed drafter: the
    calibration pass samples from the fp16-KV target graph too)."""
    root = tmp_path_factory.mktemp("kv")
    target = write_tiny_gguf(root / "target.gguf", "llama", 2, seed=1)
    drafter = write_tiny_gguf(root / "drafter.gguf", "llama", 1, seed=2)
    prompts = root / "prompts.txt"
    prompts.write_text("chat:hello world\nchat:what is the capital of the world\ndef hello():\\n\n", encoding="utf-8")
    out = {}
    for kv in ("float32", "float16"):
        opts = ExportOptions(trim_vocab=120, calibration=prompts, max_context=256, measure_memory=False,
                             target_quant=Quant("int4", 4),
                             drafter_quant=Quant("int4", 4), gguf_mode="split", kv_dtype=kv)
        export_bundle(str(target), str(drafter), root / kv, opts, progress=None)
        out[kv] = root / kv
    return out


def test_manifest_and_plan_count_fp16_kv(pair: dict[str, Path]) -> None:
    from edge_spec.runtime.engine import Engine

    m32, m16 = read_manifest(pair["float32"]), read_manifest(pair["float16"])
    assert m32.target.quantization.kv_dtype is None and m32.target.quantization.kv_cache_dtype == "float32"
    assert m16.target.quantization.kv_dtype == "float16" and m16.target.quantization.io_dtype == "float32"
    assert m16.target.kv_bytes_per_token * 2 == m32.target.kv_bytes_per_token
    assert m16.drafter.kv_bytes_per_token * 2 == m32.drafter.kv_bytes_per_token
    kv = {k: dict(Engine.plan(p, max_context=256).items) for k, p in pair.items()}
    key = "target KV cache (256 tokens x {} B)"
    assert kv["float16"][key.format(m16.target.kv_bytes_per_token)] * 2 == \
        kv["float32"][key.format(m32.target.kv_bytes_per_token)]
    engine = Engine.load(pair["float16"], max_context=256)
    assert engine.target.kv.keys[0].dtype == np.float16 and engine.target.logits.dtype == np.float32
    rows = engine.target.kv.keys[0].shape[2]  # capacity + the padding rows of batch-invariant passes
    assert engine.target.kv.nbytes == rows * m16.target.kv_bytes_per_token


def test_old_manifests_without_kv_dtype_load() -> None:
    q = asdict(Quantization("int4", 32, 4))
    q.pop("kv_dtype")
    from edge_spec.bundle.read import _build

    assert _build(Quantization, q, "target.quantization").kv_cache_dtype == "float32"


def test_fp16_kv_follows_fp32_and_speculative_equals_plain(pair: dict[str, Path]) -> None:
    from edge_spec.runtime.engine import Engine

    e32, e16 = Engine.load(pair["float32"], max_context=256), Engine.load(pair["float16"], max_context=256)
    ids = [1, 60, 61, 300, 5, 100, 250, 2, 7, 9, 11, 40]
    a = np.array(e32.target.forward(ids))
    b = np.array(e16.target.forward(ids))
    assert 0 < np.abs(a - b).max() < 1e-2 * max(1.0, np.abs(a).max())  # fp16 rounding of K/V, nothing more
    assert_greedy_sd_equals_ar(e16, 32)


def test_context_is_sized_for_the_request(pair: dict[str, Path]) -> None:
    from edge_spec.runtime.engine import Engine

    bundle = pair["float32"]
    assert Engine.plan(bundle).max_context == 256  # no request: the bundle's context
    plan = Engine.plan(bundle, prompt="hello world", max_new_tokens=100)
    assert plan.max_context == 128 and "sized for the request" in plan.notes[0]
    assert Engine.plan(bundle, prompt=list(range(3, 103)), max_new_tokens=100).max_context == 256
    assert Engine.plan(bundle, prompt="hi", max_new_tokens=100, max_context=200).max_context == 200  # explicit wins
    assert Engine.plan(bundle, prompt="hi", max_new_tokens=5000).max_context == 256  # capped by the bundle
    assert Engine.plan(bundle, prompt=[], max_new_tokens=127).max_context == 128
    chat = Engine.plan(bundle, prompt=[{"role": "user", "content": "hello"}], max_new_tokens=127)
    assert chat.max_context == 256  # the chat template's tokens count too
    engine = Engine.load(bundle, prompt="hello world", max_new_tokens=100)
    assert engine.plan == plan and engine.target.capacity == 128


def test_generate_and_inspect_plan_the_request_alike(pair: dict[str, Path]) -> None:
    def plan(cmd: list[str]) -> dict:
        proc = subprocess.run([sys.executable, "-m", "edge_spec", *cmd, str(pair["float32"]), "--json", "--prompt",
                               "hello world", "--max-new-tokens", "20"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return {k: json.loads(proc.stdout)["plan"][k] for k in ("mode", "max_context", "draft_length")}

    gen = plan(["generate"])
    assert gen == plan(["inspect"]) and gen["max_context"] == 128
