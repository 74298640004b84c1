"""Bundles packaged for ONNX Runtime Mobile: ORT-format graphs, the reduced-build operator config, the manifest's
graph_format, and the same tokens as the ONNX bundle they were made from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import MANIFEST_NAME, SCHEMA_VERSION, manifest_from_json, read_manifest
from edge_spec.cli import main
from edge_spec.errors import BundleError
from tests.test_bundle import make_manifest

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ([1, 60, 61, 300, 5, 100], [7, 8, 9, 10, 11, 12, 7, 8, 9], [200, 201, 17, 4, 4, 4, 90])


# ------------------------------------------------------------------------------ the manifest field (fast)
def test_graph_format_defaults_to_onnx_and_is_checked() -> None:
    data = json.loads(json.dumps(make_manifest().to_json()))
    assert data["version"] == SCHEMA_VERSION == 13 and data["target"]["graph_format"] == "onnx"
    for role in ("target", "drafter"):  # a version-5 manifest has no such field: its graphs are ONNX
        del data[role]["graph_format"]
    data["version"] = 5
    assert manifest_from_json(data).target.graph_format == "onnx"
    data["target"]["graph_format"] = "tflite"
    with pytest.raises(BundleError, match="graph_format' is 'tflite' but must be 'onnx' or 'ort'"):
        manifest_from_json(data)


# ------------------------------------------------------------------------------ bad input (fast)
@pytest.mark.parametrize("what", ["empty dir", "file", "missing"])
def test_package_refuses_what_is_not_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture, what: str) -> None:
    src = tmp_path / "src"
    if what == "empty dir":
        src.mkdir()
    elif what == "file":
        src.write_text("not a bundle")
    rc = main(["package", str(src), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("edge-spec: error: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


# ------------------------------------------------------------------------------ a tiny GGUF pair, exported (~5 s)
@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(ONNX bundle, its ORT-format package) of a tiny GGUF pair that shares its embedding, as the demo does."""
    from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle
    from tests.test_gguf_export import write_tiny_gguf

    root = tmp_path_factory.mktemp("mobile")
    target = write_tiny_gguf(root / "target.gguf", "llama", 2, seed=1)
    drafter = write_tiny_gguf(root / "drafter.gguf", "llama", 1, seed=2)
    opts = ExportOptions(trim_vocab=None, max_context=128, target_quant=Quant("int4", 4),
                         drafter_quant=Quant("int4", 4), gguf_mode="split")
    export_bundle(str(target), str(drafter), root / "onnx", opts, progress=None)
    assert main(["package", str(root / "onnx"), "--out", str(root / "ort")]) == 0
    return root / "onnx", root / "ort"


def test_package_writes_ort_graphs_configs_and_a_measured_manifest(pair: tuple[Path, Path]) -> None:
    onnx_dir, ort_dir = pair
    src, m = read_manifest(onnx_dir), read_manifest(ort_dir)
    assert not list(ort_dir.rglob("*.onnx*")) and not list(ort_dir.rglob(".*"))
    for spec, before in ((m.target, src.target), (m.drafter, src.drafter)):
        assert spec.graph_format == "ort" and spec.graph.endswith("/model.ort") and spec.data_files == ()
        assert spec.weight_bytes == (ort_dir / spec.graph).stat().st_size
        assert spec.load_peak_bytes is not None and spec.load_peak_bytes >= spec.load_bytes > 0
        assert spec.genai_config is None and before.graph_format == "onnx"
    assert m.shared_initializers == src.shared_initializers and (ort_dir / "target/embed.data").is_file()
    ops = (ort_dir / "required_operators.config").read_text()
    assert "com.microsoft;1;" in ops and "MatMulNBits" in ops and "GroupQueryAttention" in ops
    assert "# - target/model.ort" in ops and "tmp" not in ops
    assert '"inputs"' in (ort_dir / "required_operators_and_types.config").read_text()
    assert m.notes["mobile"]["source_bundle"] == str(onnx_dir) and m.version == SCHEMA_VERSION


def test_ort_graph_gives_the_onnx_graphs_logits_bit_for_bit(pair: tuple[Path, Path]) -> None:
    from edge_spec.runtime.session import ModelSession, shared_initializers

    out = {}
    for root in pair:
        m = read_manifest(root)
        shared = shared_initializers(root, m)
        for role, spec in (("target", m.target), ("drafter", m.drafter)):
            s = ModelSession(root / spec.graph, spec, providers=["CPUExecutionProvider"], device="cpu", capacity=64,
                             max_rows=16, initializers=shared)
            out[root.name, role] = np.array(s.forward(PROMPTS[0])), np.array(s.forward([3]))
    for role in ("target", "drafter"):
        for a, b in zip(out["onnx", role], out["ort", role]):
            np.testing.assert_array_equal(a, b)


def test_ort_bundle_greedy_tokens_equal_the_onnx_bundle_and_speculation_equals_plain(pair: tuple[Path, Path]) -> None:
    from edge_spec.runtime.engine import Engine

    onnx_dir, ort_dir = pair
    ref, ort_engine = Engine.load(onnx_dir, max_context=128), Engine.load(ort_dir, max_context=128)
    assert ort_engine.plan.mode == "speculative"
    for ids in PROMPTS:
        want = ref.generate(ids, max_new_tokens=24, speculative=False).token_ids
        assert ort_engine.generate(ids, max_new_tokens=24, speculative=False).token_ids == want
        assert ort_engine.generate(ids, max_new_tokens=24).token_ids == want  # greedy speculative == greedy plain
        # a fixed draft length drafts every step, whatever the goodput controller would decide on a loaded machine
        assert ort_engine.generate(ids, max_new_tokens=24, draft_length=3).token_ids == want
        assert ort_engine.last_stats.drafted > 0
        sampled = dict(max_new_tokens=24, temperature=0.8, seed=3)
        assert ort_engine.generate(ids, **sampled).token_ids == ref.generate(ids, **sampled).token_ids


LEAN = r"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "onnx", "onnxruntime_genai"):
            raise ImportError(f"{name} is blocked: the runtime must stay lean")
sys.meta_path.insert(0, Blocker())
from edge_spec import Engine
e = Engine.load(sys.argv[1], max_context=128)
print(list(e.generate([1, 60, 61, 300, 5, 100], max_new_tokens=8).token_ids))
"""


def test_ort_bundle_loads_without_the_export_packages(pair: tuple[Path, Path]) -> None:
    proc = subprocess.run([sys.executable, "-c", LEAN, str(pair[1])], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout.strip().splitlines()[-1])) == 8


def test_package_refuses_an_ort_bundle_and_an_existing_out(pair: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    onnx_dir, ort_dir = pair
    for argv, says in (([str(ort_dir), "--out", str(tmp_path / "again")], "already has ORT-format graphs"),
                       ([str(onnx_dir), "--out", str(ort_dir)], "already exists; pass --force"),
                       ([str(onnx_dir), "--out", str(onnx_dir)], "is the bundle itself")):
        assert main(["package", *argv]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert json.loads((ort_dir / MANIFEST_NAME).read_text())["target"]["graph_format"] == "ort"


def test_export_mobile_writes_an_ort_bundle(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.test_gguf_export import write_tiny_gguf

    target = write_tiny_gguf(tmp_path / "t.gguf", "llama", 1, seed=4)
    rc = main(["export", "--target", str(target), "--out", str(tmp_path / "b"), "--max-context", "64", "--mobile"])
    assert rc == 0 and "ORT-format bundle" in capsys.readouterr().out
    m = read_manifest(tmp_path / "b")
    assert m.drafter is None and m.target.graph == "target/model.ort" and m.target.graph_format == "ort"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "t.gguf"]  # the ONNX bundle in between is gone


def test_package_without_onnx_says_what_to_install(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The converter imports onnx (the export extra); the base install gets one sentence, not a traceback."""
    script = LEAN.split("from edge_spec import Engine")[0] + (
        "from edge_spec.cli import main\nraise SystemExit(main(['package', sys.argv[1], '--out', sys.argv[2]]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(pair[0]), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("edge-spec: error: Packaging for ONNX Runtime Mobile needs ONNX Runtime's "
                                   "converter, which imports 'onnx'; install the export extra: pip install "
                                   "'edge-spec[export]'.")
    assert not (tmp_path / "out").exists()


def test_an_eagle3_bundle_packages_and_gives_the_same_tokens(tmp_path: Path) -> None:
    """A feature drafter's graph (target_hidden / prev_hidden inputs, hidden_out) and a target that outputs its
    features convert too; tokens equal the ONNX bundle's, speculative equals plain."""
    pytest.importorskip("torch")
    from edge_spec.export import own_build
    from edge_spec.export.pipeline import ExportOptions, Quant, export_bundle
    from edge_spec.fetch import file_sha256
    from edge_spec.runtime.engine import Engine
    from tests.test_eagle import _config, random_head, save_head
    from tests.test_gguf_export import write_tiny_gguf

    target = write_tiny_gguf(tmp_path / "t.gguf", "llama", 3, seed=1)
    vocab = int(own_build.gguf_source(str(target), "target").config["vocab_size"])
    save_head(random_head(_config(vocab=vocab)), tmp_path / "head",
              extra={"edge_spec_drafter": {"target_sha256": file_sha256(target)}})
    opts = ExportOptions(trim_vocab=None, max_context=64, target_quant=Quant("int4", 4), gguf_mode="split")
    export_bundle(str(target), str(tmp_path / "head"), tmp_path / "onnx", opts, progress=None)
    assert main(["package", str(tmp_path / "onnx"), "--out", str(tmp_path / "ort")]) == 0
    m = read_manifest(tmp_path / "ort")
    assert m.drafter.kind == "eagle3" and m.drafter.graph_format == "ort" and m.target.feature_layers == [0, 2, 3]
    ref = Engine.load(tmp_path / "onnx", max_context=64)
    packaged = Engine.load(tmp_path / "ort", max_context=64, drafting="model")  # the head drafts every step
    drafted = 0
    for ids in PROMPTS:
        want = ref.generate(ids, max_new_tokens=16, speculative=False).token_ids
        assert packaged.generate(ids, max_new_tokens=16, speculative=False).token_ids == want
        sd = packaged.generate(ids, max_new_tokens=16, draft_length=3)  # fixed: a random head would be switched off
        assert sd.token_ids == want
        drafted += sd.stats.drafted
    assert drafted > 0
