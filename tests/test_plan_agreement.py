"""`edge-spec inspect --memory-budget` and a real load (`edge-spec generate`) make the same plan."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _plan(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "edge_spec", *args, "--json"], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    data = json.loads(proc.stdout)
    return {k: data["plan"][k] for k in ("mode", "max_context", "draft_length")}


def test_inspect_and_generate_plan_identically(demo_bundle):
    lower = None
    for budget in ("90MB", "100MB", "120MB", "150MB", "1GB"):
        # generate sizes the context for its request; inspect plans the same request when told it
        inspect = _plan(["inspect", str(demo_bundle), "--memory-budget", budget, "--prompt", "x",
                         "--max-new-tokens", "1"])
        generate = _plan(["generate", str(demo_bundle), "--prompt", "x", "--max-new-tokens", "1",
                          "--memory-budget", budget])
        assert inspect.keys() == generate.keys(), (budget, inspect, generate)
        if "error" in inspect:
            assert "cannot run this bundle" in inspect["error"] and "cannot run this bundle" in generate["error"]
            lower = budget
        else:
            assert inspect == generate, budget
    assert lower is not None  # the smallest budget was refused by both, the others planned alike
