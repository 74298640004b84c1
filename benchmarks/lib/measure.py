"""Run one system in its own process and bring back its timings and peak memory.

Every system (edge-spec, ORT GenAI, transformers) is measured in a fresh child process, so
its peak RSS is its own: VmHWM of the child, plus the RSS right after imports
(``rss_baseline``) so the runtime's own footprint can be told apart from the interpreter's.

Parent side: :func:`measure(spec)`. Child side: ``python -m benchmarks.lib.measure`` reads the
spec as JSON on stdin, calls ``<module>.run_worker(spec, timer)`` of the module the spec names
(``benchmarks.lib.edge``, ``.genai``, ``.hf`` or ``.targets``) and prints one JSON line.

A worker generates from token ids (the parent tokenises once, so every system sees the same
ids) and reports, per prompt and repeat, generated tokens, wall seconds and time to first
token; :func:`summarise` turns them into medians.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Peak RSS is VmHWM, not ``ru_maxrss``: Linux keeps the latter across exec, so a child started from
# a large parent (run_all holds torch models) would report the parent's peak.
from edge_spec.runtime.memory import peak_rss as peak_rss_bytes

ROOT = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "@@RESULT@@ "


def measure(spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Run ``spec`` in a child process; returns its result dict, or ``{"error": ...}``."""
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env.update(spec.get("env") or {})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.lib.measure"], input=json.dumps(spec), text=True,
                              capture_output=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


class RunTimer:
    """Collects per-run records inside a worker: call ``start()``, ``first()`` at the first token, ``stop(n)``."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self._t0 = self._t1 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._t1 = 0.0

    def first(self) -> None:
        if not self._t1:
            self._t1 = time.perf_counter()

    def stop(self, new_tokens: int, **extra: Any) -> dict[str, Any]:
        end = time.perf_counter()
        rec = {"tokens": int(new_tokens), "seconds": end - self._t0,
               "ttft": (self._t1 or end) - self._t0, **extra}
        self.runs.append(rec)
        return rec


def summarise(runs: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Median over repeats of (all prompts' tokens / all prompts' seconds); median TTFT over runs."""
    measured = [r for r in runs if not r.get("warmup")]
    if not measured:
        return {}
    per_repeat = []
    for rep in range(repeats):
        rs = [r for r in measured if r["repeat"] == rep]
        if rs:
            per_repeat.append(sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs))
    decode = [(r["tokens"] - 1) / (r["seconds"] - r["ttft"]) for r in measured
              if r["tokens"] > 1 and r["seconds"] > r["ttft"]]
    return {
        "tokens_per_s": statistics.median(per_repeat),
        "tokens_per_s_repeats": per_repeat,
        "decode_tokens_per_s": statistics.median(decode) if decode else None,
        "ttft_ms": 1e3 * statistics.median(r["ttft"] for r in measured),
        "mean_new_tokens": statistics.fmean(r["tokens"] for r in measured),
    }


def run_prompts(spec: dict[str, Any], generate_one) -> RunTimer:
    """Drive ``generate_one(ids, timer, seed) -> (new_token_ids, extra)`` over warmup + repeats x prompts.

    The seed of a run depends only on (spec seed, prompt index), so every repeat and every
    system samples with the same seed for the same prompt."""
    timer = RunTimer()
    prompts = spec["prompt_ids"]
    for rep in range(-spec.get("warmup", 1), spec["repeats"]):
        for i, ids in enumerate(prompts):
            if rep < 0 and i > 0:
                break  # warm up on the first prompt only
            seed = int(spec.get("seed", 0)) + i
            timer.start()
            out, extra = generate_one(list(ids), timer, seed)
            rec = timer.stop(len(out), prompt=i, repeat=rep, warmup=rep < 0, **extra)
            if rep == 0:
                rec["token_ids"] = [int(t) for t in out]
    return timer


def _worker() -> None:
    spec = json.loads(sys.stdin.read())
    module = importlib.import_module("benchmarks.lib." + spec["module"])
    t0 = time.perf_counter()
    out = module.run_worker(spec)
    out["worker_seconds"] = time.perf_counter() - t0
    out["peak_rss"] = peak_rss_bytes()
    out["spec"] = {k: v for k, v in spec.items() if k != "prompt_ids"}
    print(RESULT_PREFIX + json.dumps(out), flush=True)


if __name__ == "__main__":
    _worker()
