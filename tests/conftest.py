"""Shared fixtures: the demo bundle, exported once and cached across sessions.

The cache key covers the demo checkpoints and the exporter's source, so a change to either
re-exports; the bundle lives in ``.cache/test-bundles/<key>`` (git-ignored)."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
if str(ROOT) not in sys.path:  # tests reuse a few benchmark helpers (prompt sets, the plain ONNX Runtime reference)
    sys.path.insert(0, str(ROOT))


def _key() -> str:
    from edge_spec.export.pipeline import checkpoint_sha256

    h = hashlib.sha256()
    for role in ("target", "drafter"):
        h.update(checkpoint_sha256(DEMO / role).encode())
        h.update((DEMO / role / "tokenizer.json").read_bytes())
    for src in [p for part in ("export", "bundle") for p in sorted((ROOT / "edge_spec" / part).glob("*.py"))]:
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


# --- the real demo pair: SmolLM2-135M-Instruct (GGUF, fetched from the package index) + its committed drafter ---

SMOLLM2_DRAFTER = ROOT / "models" / "smollm2-eagle3"  # the demo's: an EAGLE-3 head
# Calibration for the drafter's VocabTrim: a quarter of the built-in set. Calibration only chooses the drafter's
# kept vocabulary (the target graph does not depend on it) and is most of an export's time (~3 of 4.5 minutes
# for the full 24 prompts x 4 samples on 2 loaded cores).
SMOLLM2_CALIBRATION_STEP = 4
# name -> export options of the configurations the tests run on the real pair
SMOLLM2_CONFIGS: dict[str, dict] = {
    # the export defaults, as the demo uses them: --gguf-mode auto (the file's blocks on the K-quant kernels where
    # they run, else split: every weight equals the file's, int8 activations), fp16 KV cache; and the demo's n-gram
    # table (its committed answers files)
    "default": {"ngrams": "demo"},
    # the reference graph: fp32 MatMuls of the file's exact weights, fp32 activations, fp32 KV
    "exact": {"gguf_mode": "exact", "target_quant": ("int4", 1), "kv_dtype": "float32"},
    # the defaults with the 3-layer drafter the head replaced (a drafter model on its own KV, no features)
    "layers": {"drafter": "smollm2-drafter"},
}


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The demo target's GGUF, through edge_spec.fetch (the package index; cached in the user cache)."""
    from edge_spec.demo import DEMO_TARGET, cache_root, offline
    from edge_spec.errors import EdgeSpecError
    from edge_spec.fetch import fetch_model

    try:
        return fetch_model(DEMO_TARGET, cache_root(), offline=offline())
    except EdgeSpecError as exc:  # CI has the package index; a machine without it cannot run these tests
        pytest.fail(f"the demo GGUF could not be fetched: {exc}")


@pytest.fixture(scope="session")
def smollm2_bundle_for(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """``get(name) -> bundle dir``: the real pair exported once per session per configuration (SMOLLM2_CONFIGS),
    removed at the end of the session (an exact bundle is ~0.6 GB)."""
    from edge_spec.export.calibrate import DEFAULT_PROMPTS
    from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle

    root = tmp_path_factory.mktemp("smollm2")
    calib = root / "calibration.txt"
    calib.write_text("".join(p.replace("\n", "\\n") + "\n" for p in DEFAULT_PROMPTS[::SMOLLM2_CALIBRATION_STEP]),
                     encoding="utf-8")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            opts = dict(SMOLLM2_CONFIGS[name])
            if "target_quant" in opts:
                opts["target_quant"] = Quant(*opts["target_quant"])
            drafter = ROOT / "models" / opts.pop("drafter") if "drafter" in opts else SMOLLM2_DRAFTER
            if opts.get("ngrams") == "demo":
                from edge_spec.demo import DEMO_DATA

                opts["ngrams"] = tuple(sorted(DEMO_DATA.glob("answers*.npz")))
            out = root / name.replace(":", "_")
            export_bundle(str(smollm2_gguf), str(drafter), out, ExportOptions(calibration=calib, **opts),
                          progress=None)
            made[name] = out
        return made[name]

    yield get
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder pip takes as its only package index (fake wheels for the fetch tests; no network)."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random Llama with the demo pair's tokenizer and chat template (the distill tests' target)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("tiny-target")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEMO / "target" / name, out / name)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=True, eos_token_id=[1, 2], pad_token_id=0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    return out
