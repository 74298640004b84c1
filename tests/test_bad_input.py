"""Bad input ends in one sentence and a non-zero exit, never a traceback (issue 9, items 3, 7, 8, 10-15).

CLI cases run ``python -m edge_spec`` in a subprocess, as a user would; API cases call the library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from edge_spec.bundle import MANIFEST_NAME, manifest_from_json, read_manifest
from edge_spec.errors import BundleError, EdgeSpecError

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, stdin: bytes | None = None, drop_privileges: bool = False) -> subprocess.CompletedProcess:
    """``edge-spec ARGS`` in a fresh process. ``drop_privileges``: as root, without the capabilities that
    bypass file permissions, so a mode-000 file is unreadable as it is for any other user."""
    cmd = [sys.executable, "-m", "edge_spec", *args]
    if drop_privileges and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be tested")
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", "--bounding-set", caps, "--inh-caps", caps, "--", *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, input=stdin if stdin is not None else b"", capture_output=True, env=env, timeout=120)


def one_sentence(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.decode()
    assert proc.returncode != 0, err
    assert "Traceback" not in err, err
    assert err.startswith("edge-spec: error:") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err


# ------------------------------------------------------------------------------ CLI, no bundle needed
def test_memory_budget_without_unit_is_refused_not_bytes():
    one_sentence(cli("inspect", "nowhere", "--memory-budget", "600"), "no unit", "600MB")
    from edge_spec.runtime.budget import parse_budget

    with pytest.raises(EdgeSpecError, match="no unit"):
        parse_budget("600")
    assert parse_budget("600B") == 600 and parse_budget(600) == 600  # explicit bytes still work


def test_negative_seed_is_one_sentence():
    one_sentence(cli("generate", "nowhere", "--prompt", "x", "--seed", "-1"), "--seed")


def test_invalid_utf8_on_stdin_is_one_sentence():
    one_sentence(cli("generate", "nowhere", stdin=b"\xff\xfe def f(x):"), "not UTF-8", "0xff")


def test_bench_on_a_bad_bundle_writes_nothing(tmp_path):
    out = tmp_path / "report"
    one_sentence(cli("bench", str(tmp_path / "missing"), "--out", str(out)), "does not exist")
    assert not out.exists()


def test_export_help_has_examples_and_architectures():
    proc = cli("export", "--help")
    text = proc.stdout.decode()
    assert proc.returncode == 0 and "examples:" in text and "Llama" in text and "Qwen2" in text


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, "lots", [600]])
def test_api_memory_budget_type_errors(bad):
    from edge_spec import Engine

    with pytest.raises(EdgeSpecError, match="memory_budget"):
        Engine.load("nowhere", memory_budget=bad)


@pytest.mark.parametrize("bad", [{"temperature": "hot"}, {"temperature": float("inf")}, {"seed": -1},
                                 {"seed": 1.5}, {"top_k": "3"}, {"stop_token_ids": ["x"]}, {"stop": [1]},
                                 {"max_new_tokens": 2.0}, {"speculative": "yes"}])
def test_api_generation_config_type_errors(bad):
    from edge_spec.runtime.config import GenerationConfig

    with pytest.raises(EdgeSpecError):
        GenerationConfig(**bad)


# ------------------------------------------------------------------------------ export leftovers, permissions
def test_export_removes_leftovers_of_a_killed_export_and_opens_permissions(tmp_path):
    from edge_spec.export.destination import finish, prepare_destination

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs, like a SIGKILLed export's
    stale = tmp_path / f".bundle.tmp-{dead.pid}-abc"
    live = tmp_path / f".bundle.tmp-{os.getpid()}-def"  # a concurrent export still running: kept
    for d in (stale, live):
        d.mkdir()
    tmp = prepare_destination(tmp_path / "bundle", force=False)
    assert not stale.exists() and live.exists() and tmp.exists()
    (tmp / "drafter").mkdir()
    data = tmp / "drafter" / "model.onnx.data"
    data.write_bytes(b"x")
    data.chmod(0o600)  # what onnx's external-data writer leaves
    finish(tmp, tmp_path / "bundle")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "bundle" / "drafter" / "model.onnx.data").stat().st_mode & 0o777 == 0o666 & ~mask


# ------------------------------------------------------------------------------ manifest validation
@pytest.fixture(scope="module")
def manifest_json(demo_bundle: Path) -> dict:
    return json.loads((demo_bundle / MANIFEST_NAME).read_text())


def _mutated(data: dict, path: str, value) -> dict:
    data = json.loads(json.dumps(data))
    *head, last = path.split(".")
    node = data
    for k in head:
        node = node[k]
    node[last] = value
    return data


@pytest.mark.slow
@pytest.mark.parametrize("path,value,needle", [
    ("target.num_layers", "six", "should be int"), ("target.max_context", -5, "must be >= 1"),
    ("target.kv_bytes_per_token", 0, "kv_bytes_per_token"), ("target.head_size", True, "should be int"),
    ("tokenizer.stop_token_ids", ["x"], "token id"), ("tokenizer.stop_token_ids", [10**9], "token id"),
    ("target.num_attention_heads", 7, "inconsistent heads"), ("drafter.vocab_size", 10**6, "vocabulary"),
])
def test_manifest_wrong_types_and_values(manifest_json, path, value, needle):
    with pytest.raises(BundleError, match=needle):
        manifest_from_json(_mutated(manifest_json, path, value))


@pytest.fixture()
def bundle_copy(demo_bundle: Path) -> Path:
    d = Path(tempfile.mkdtemp(prefix="edge-spec-bad-"))
    d.chmod(0o755)
    shutil.copytree(demo_bundle, d / "b")
    yield d / "b"
    shutil.rmtree(d, ignore_errors=True)


def _rewrite(bundle: Path, path: str, value) -> None:
    data = json.loads((bundle / MANIFEST_NAME).read_text())
    (bundle / MANIFEST_NAME).write_text(json.dumps(_mutated(data, path, value)))


@pytest.mark.slow
def test_manifest_not_matching_the_graph_is_refused_at_load(bundle_copy):
    from edge_spec import Engine

    t = json.loads((bundle_copy / MANIFEST_NAME).read_text())["target"]
    per_layer = t["kv_bytes_per_token"] // t["num_layers"]
    _rewrite(bundle_copy, "target.num_layers", 3)  # kv_bytes_per_token kept consistent: only the graph disagrees
    _rewrite(bundle_copy, "target.kv_bytes_per_token", 3 * per_layer)
    with pytest.raises(BundleError, match="num_layers is 3 but the graph"):
        Engine.load(bundle_copy)
    one_sentence(cli("inspect", str(bundle_copy)), "num_layers is 3")  # inspect checks the graphs too
    _rewrite(bundle_copy, "target.num_layers", t["num_layers"])
    _rewrite(bundle_copy, "target.head_size", t["head_size"] * 2)
    _rewrite(bundle_copy, "target.kv_bytes_per_token", t["kv_bytes_per_token"] * 2)
    with pytest.raises(BundleError, match="head size 64.*dimension"):
        Engine.load(bundle_copy)


@pytest.mark.slow
def test_inspect_fails_on_a_corrupt_graph(bundle_copy):
    (bundle_copy / "drafter" / "model.onnx").write_bytes(b"not a graph")
    one_sentence(cli("inspect", str(bundle_copy)), "could not load", "drafter/model.onnx")


@pytest.mark.slow
def test_duplicate_ids_in_the_id_map_are_refused(bundle_copy):
    from edge_spec import Engine

    m = read_manifest(bundle_copy)
    ids = np.load(bundle_copy / m.vocab_trim.id_map)
    ids[1] = ids[0]
    np.save(bundle_copy / m.vocab_trim.id_map, ids)
    with pytest.raises(BundleError, match="twice"):
        Engine.load(bundle_copy)


@pytest.mark.slow
@pytest.mark.parametrize("name", [MANIFEST_NAME, "drafter/model.onnx.data", "target/model.onnx"])
def test_unreadable_files_say_permission_not_corrupt(bundle_copy, name):
    (bundle_copy / name).chmod(0o000 if name == MANIFEST_NAME else 0o600)
    if name != MANIFEST_NAME:
        os.chown(bundle_copy / name, 65534, 65534) if os.geteuid() == 0 else (bundle_copy / name).chmod(0o000)
    err = one_sentence(cli("generate", str(bundle_copy), "--prompt", "x", drop_privileges=True),
                       "not readable by this user", "chmod -R a+rX")
    assert "corrupt" not in err and "re-export" not in err


@pytest.mark.slow
def test_exported_bundle_is_readable_by_everyone(demo_bundle):
    for p in demo_bundle.rglob("*"):
        assert p.stat().st_mode & 0o004, p  # other users can read (the export used to leave 0600 data files)


# ------------------------------------------------------------------------------ API type errors with an engine
@pytest.mark.slow
def test_api_prompt_and_chat_type_errors(demo_bundle):
    from edge_spec import Engine

    e = Engine.load(demo_bundle, max_context=256)
    for bad in (["a"], [None], [1.5, 2], [True], 3):
        with pytest.raises(EdgeSpecError, match="prompt must be"):
            e.generate(bad, max_new_tokens=2)
    with pytest.raises(EdgeSpecError, match="list of messages"):
        e.chat(["hi"])
    with pytest.raises(EdgeSpecError, match="temperature"):
        e.generate("x", temperature=float("inf"))
    assert e.generate(np.array([5, 6]), max_new_tokens=2).token_ids  # numpy ids are fine


def test_readme_states_suite_time_fast_subset_and_the_clis_export_time():
    readme = (ROOT / "README.md").read_text()
    assert '-m "not slow"' in readme and "about 20 minutes" in readme
    import inspect

    from edge_spec import demo

    assert f"({demo.EXPORT_TIME}" in readme and "{pair.export_time}" in inspect.getsource(demo.pair_bundle)
    assert "1 to 1.5 minutes on 2" in cli("export", "--help").stdout.decode().replace("\n", " ")  # the toy pair
