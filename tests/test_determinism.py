"""Sampled output is a function of (seed, prompt, settings) only: whatever draft lengths the adaptive policy
picks, across calls on one engine and across processes; tiny temperatures are near-greedy, never NaN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_runtime_support import runtime_bundle

from edge_spec import Engine
from edge_spec.runtime.drafting import DraftPolicy

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def parse(line):\n"
SETTINGS = {"max_new_tokens": 48, "temperature": 0.8, "top_p": 0.95, "seed": 1234, "config": {"stop_token_ids": ()}}


@pytest.fixture(scope="module")
def bundle(request) -> Path:
    return runtime_bundle(request)


@pytest.fixture(scope="module")
def engine(bundle) -> Engine:
    return Engine.load(bundle)


class _Jittery(DraftPolicy):
    """The adaptive policy with its measured step costs jittered, as load on the machine does."""

    def __init__(self, max_gamma: int, seed: int) -> None:
        import random

        super().__init__(max_gamma)
        self.rand = random.Random(seed)

    def update(self, gamma, accepted, t_draft, t_verify, drafter_passes=0, timed=True):
        f = self.rand.uniform(0.2, 5.0)
        super().update(gamma, accepted, t_draft * f, t_verify / f, drafter_passes, timed)


def test_same_seed_same_text_across_10_calls_with_adaptive_gamma(engine):
    outs, gammas = set(), set()
    for i in range(10):
        engine._policy = _Jittery(engine.plan.draft_length, i)  # each call sees other "timings"
        r = engine.generate(PROMPT, **SETTINGS)
        outs.add(r.token_ids)
        gammas.add(tuple(sorted(r.stats.gamma_hist.items())))
    assert len(gammas) > 1  # the draft lengths really differed between calls
    assert len(outs) == 1
    assert engine.generate(PROMPT, **SETTINGS, speculative=False).token_ids in outs  # = plain sampling
    other = engine.generate(PROMPT, **{**SETTINGS, "seed": 99}).token_ids
    assert other not in outs


def test_same_seed_same_text_across_processes(engine, bundle):
    code = ("import json, sys; from edge_spec import Engine; e = Engine.load(sys.argv[1]); "
            f"r = e.generate({PROMPT!r}, **json.loads(sys.argv[2])); print(json.dumps(list(r.token_ids)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = [json.loads(subprocess.run([sys.executable, "-c", code, str(bundle), json.dumps(SETTINGS)], env=env,
                                      capture_output=True, text=True, check=True).stdout) for _ in range(2)]
    assert runs[0] == runs[1] == list(engine.generate(PROMPT, **SETTINGS).token_ids)


def test_tiny_temperature_is_near_greedy(engine):
    greedy = engine.generate(PROMPT, max_new_tokens=24, config={"stop_token_ids": ()})
    for t in (1e-38, 1e-45):
        r = engine.generate(PROMPT, max_new_tokens=24, temperature=t, seed=0, config={"stop_token_ids": ()})
        assert r.token_ids == greedy.token_ids


def test_cli_seed_reproduces_across_runs(bundle):
    cmd = [sys.executable, "-m", "edge_spec", "generate", str(bundle), "--prompt", PROMPT, "--temperature", "0.9",
           "--seed", "5", "--max-new-tokens", "40", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ids = [json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)["token_ids"]
           for _ in range(3)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) > 0
