"""'demo' as a bundle name (generate, inspect, Engine.load) and the README's API example, verbatim.

The demo cache is pointed (EDGE_SPEC_HOME) at a directory where the demo bundle is already
exported under the name edge_spec.demo computes, so the resolution is real and no export runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge_spec.demo import demo_checkpoints, demo_key, resolve_bundle

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def demo_home(tmp_path: Path, demo_bundle: Path, monkeypatch) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    (home / f"demo-{demo_key(demo_checkpoints())}").symlink_to(demo_bundle)
    monkeypatch.setenv("EDGE_SPEC_HOME", str(home))
    monkeypatch.chdir(tmp_path)  # no ./demo here
    return {**os.environ, "EDGE_SPEC_HOME": str(home), "PYTHONPATH": str(ROOT)}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_demo_resolves_and_a_real_directory_named_demo_wins(demo_home, tmp_path):
    assert (resolve_bundle("demo") / "edge_spec.json").is_file()
    (tmp_path / "demo").mkdir()
    assert resolve_bundle("demo") == Path("demo")  # a user's own ./demo is never shadowed


def test_generate_and_inspect_accept_demo(demo_home, tmp_path):
    gen = _run([sys.executable, "-m", "edge_spec", "generate", "demo", "--prompt", "def add(a, b):",
                "--max-new-tokens", "8"], demo_home, tmp_path)
    assert gen.returncode == 0 and gen.stdout.strip(), gen.stderr
    ins = _run([sys.executable, "-m", "edge_spec", "inspect", "demo"], demo_home, tmp_path)
    assert ins.returncode == 0 and "demo-" in ins.stdout, ins.stderr


def test_readme_api_example_runs_verbatim(demo_home, tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'Engine.load("demo"' in code
    proc = _run([sys.executable, "-c", code], demo_home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "speculative decoding" in proc.stdout  # plan.describe() printed
