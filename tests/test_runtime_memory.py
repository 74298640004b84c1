"""Memory claims, measured in fresh processes: flat RSS while decoding, peak RSS within the budget.

Peak RSS is the kernel's high-water mark of the child (VmHWM, i.e. ru_maxrss without the
fork-from-a-big-parent artefact: ru_maxrss survives exec)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_runtime_support import runtime_bundle

from edge_spec.bundle import read_manifest
from edge_spec.errors import BudgetError
from edge_spec.runtime.budget import SLACK_BYTES, MiB, plan_memory

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

# KV pages are committed when first written (runtime/kv.py), so the first pass over a context grows RSS by the KV
# rows it fills; a second generation over the same positions must not grow it at all (nothing allocated per step).
FLAT = r"""
import json, sys
from edge_spec import Engine
from edge_spec.runtime.memory import current_rss
e = Engine.load(sys.argv[1])
rss = {"loaded": current_rss()}
for run in ("first", "second"):
    e.reset()
    n = 0
    for ev in e.stream("Once upon a time", max_new_tokens=2000, config={"stop_token_ids": ()}):
        n += len(ev.token_ids)
        if n >= 200 and run + "200" not in rss:
            rss[run + "200"] = current_rss()
    rss[run + "_end"], rss["n"] = current_rss(), n
rss["ctx"], rss["kv"] = e.plan.max_context, e.target.kv.nbytes + (e.drafter.kv.nbytes if e.drafter else 0)
rss["gather"] = sum(s.gather_bytes or 0 for s in (e.manifest.target, e.manifest.drafter) if s is not None)
print(json.dumps(rss))
"""

PROMISE = r"""
import json, sys
from edge_spec import Engine
from edge_spec.runtime.memory import peak_rss
budget = None if sys.argv[2] == "none" else int(sys.argv[2])
e = Engine.load(sys.argv[1], memory_budget=budget)
prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)
e.generate(prompt, max_new_tokens=200, temperature=0.7, seed=0, config={"stop_token_ids": ()})
e.generate(prompt + " again", max_new_tokens=200, config={"stop_token_ids": ()})
print(json.dumps({"peak": peak_rss(), "planned": e.plan.total_bytes, "mode": e.plan.mode,
                  "ctx": e.plan.max_context, "baseline": e.plan.items[0][1], "plan": e.plan.describe()}))
"""


def _child(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bundle(request) -> Path:
    return runtime_bundle(request)


def test_rss_is_flat_while_decoding(bundle, record_property):
    out = _child(FLAT, str(bundle))
    assert out["n"] == 2000
    growth = out["second_end"] - out["second200"]
    record_property("rss_growth_200_to_2000_bytes", growth)
    print(f"\nRSS loaded {out['loaded'] / MiB:.1f} MiB; first run: after 200 tokens {out['first200'] / MiB:.1f}, "
          f"after 2000 {out['first_end'] / MiB:.1f}; second run: {out['second200'] / MiB:.1f} -> "
          f"{out['second_end'] / MiB:.1f} MiB (KV reserved {out['kv'] / MiB:.1f} MiB)")
    assert abs(growth) < 2 * MiB, out
    # the first run commits KV pages as it goes, reads embedding rows back in as new tokens appear (the pages let
    # go after load) and meets each pass shape's workspace for the first time: the growth stays within the KV
    # reservation, the embedding tables (manifest gather_bytes) and the planner's slack (budget.SLACK_BYTES)
    assert out["gather"] > 0
    assert out["first_end"] - out["loaded"] <= out["kv"] + out["gather"] + SLACK_BYTES, out


def test_kv_pages_are_committed_when_written() -> None:
    """A KV reservation costs address space, not memory, until a pass writes rows (runtime/kv.py)."""
    script = r"""
import json
from edge_spec.runtime.kv import KVCache
from edge_spec.runtime.memory import current_rss
a = current_rss()
kv = KVCache(num_layers=8, kv_heads=4, head_size=64, capacity=8192)  # 8 x 2 x 8 MiB = 128 MiB
b = current_rss()
for buf in kv.keys + kv.values:
    buf[0, :, :1024] = 1.0  # the first 1024 rows of every head: 1/8 of it
c = current_rss()
print(json.dumps({"reserved": kv.nbytes, "alloc": b - a, "written": c - b, "zero": float(kv.keys[3][0, 2, 5000, 7])}))
"""
    out = _child(script)
    assert out["reserved"] == 128 * MiB and out["zero"] == 0.0
    assert out["alloc"] < 2 * MiB, out
    assert 14 * MiB <= out["written"] <= 18 * MiB, out


def test_peak_rss_stays_within_the_budget(bundle, record_property):
    m = read_manifest(bundle)
    free = _child(PROMISE, str(bundle), "none")
    per_token = m.target.kv_bytes_per_token + m.drafter.kv_bytes_per_token
    # 1) a budget that forces a shorter context than the model's maximum
    budget = free["planned"] - (free["ctx"] // 2) * per_token
    tight = _child(PROMISE, str(bundle), str(budget))
    record_property("tight", json.dumps({k: tight[k] for k in ("peak", "planned", "ctx", "mode")}))
    assert tight["mode"] == "speculative" and tight["ctx"] < free["ctx"]
    assert tight["peak"] <= budget, tight["plan"] + f"\npeak {tight['peak'] / MiB:.1f} MiB"
    # 2) a budget the drafter does not fit: the planner degrades to prompt lookup and still keeps the promise
    small = _lookup_bound(m, free["baseline"]) + 300 * m.target.kv_bytes_per_token
    assert plan_memory(m, small, free["baseline"]).mode == "lookup"
    low = _child(PROMISE, str(bundle), str(small))
    assert low["mode"] == "lookup"
    assert low["peak"] <= small, low["plan"] + f"\npeak {low['peak'] / MiB:.1f} MiB"
    print(f"\npeak {tight['peak'] / MiB:.1f} MiB <= budget {budget / MiB:.1f} MiB (speculative, ctx {tight['ctx']}); "
          f"peak {low['peak'] / MiB:.1f} MiB <= budget {small / MiB:.1f} MiB (lookup, ctx {low['ctx']})")


def _lookup_bound(m, baseline: int) -> int:
    """Smallest budget (to 4 KiB) at which the planner picks prompt lookup (below it: plain AR, smaller chunks)."""
    lo, hi = _lower_bound(m, baseline), 1 << 36
    while hi - lo > 4096:
        mid = (lo + hi) // 2
        if plan_memory(m, mid, baseline).mode == "ar":
            lo = mid
        else:
            hi = mid
    return hi


def _lower_bound(m, baseline: int) -> int:
    try:
        plan_memory(m, 1, baseline)
    except BudgetError as err:
        mb = float(str(err).split("needs ")[1].split(" MiB")[0])
        return int(mb * MiB) + MiB
    raise AssertionError("a 1-byte budget was accepted")


def test_budget_below_the_bound_is_refused_in_one_sentence(bundle):
    from edge_spec import Engine

    with pytest.raises(BudgetError) as err:
        Engine.load(bundle, memory_budget="20MB")
    msg = str(err.value)
    assert "raise memory_budget to at least" in msg and "MiB" in msg and "target weights" in msg
    assert "\n" not in msg
