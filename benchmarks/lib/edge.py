"""edge-spec through its public API only: ``Engine.load(bundle, memory_budget=...)`` and ``Engine.stream``.

Runs in a child process started by ``measure.measure`` (see there). Per-run statistics
are the difference of ``engine.stats`` (accumulated over the engine's life) before and
after the run, so nothing private is read. The engine is reset before every run so no
prompt KV is reused between repeats — each run prefills like a fresh request.
"""

from __future__ import annotations

import inspect
from typing import Any

from edge_spec.runtime.memory import current_rss as rss_bytes
from edge_spec.runtime.memory import peak_rss as peak_rss_bytes

from .measure import run_prompts, summarise

STAT_KEYS = ("tokens", "target_passes", "drafted", "accepted", "seconds", "target_seconds", "drafter_seconds")


def runtime_available() -> str | None:
    """None when ``from edge_spec import Engine`` works, else the reason."""
    try:
        from edge_spec import Engine  # noqa: F401
    except Exception as exc:  # ImportError, or a half-written runtime failing at import
        return f"edge-spec runtime not available ({exc.__class__.__name__}: {exc})"
    return None


def _snapshot(engine: Any) -> dict[str, float]:
    st = getattr(engine, "stats", None)
    if st is None:
        return {}
    d = st.as_dict() if hasattr(st, "as_dict") else dict(vars(st))
    return {k: float(d.get(k, 0) or 0) for k in STAT_KEYS} | {"gamma_hist": dict(d.get("gamma_hist") or {})}


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    reason = runtime_available()
    if reason:
        return {"error": reason}
    from edge_spec import EdgeSpecError, Engine

    baseline = rss_bytes()
    load_kwargs: dict[str, Any] = {"memory_budget": spec.get("budget")}
    if spec.get("threads") and "threads" in inspect.signature(Engine.load).parameters:
        load_kwargs["threads"] = int(spec["threads"])
    if spec.get("spin"):
        load_kwargs["spin"] = True
    if spec.get("drafting"):
        load_kwargs["drafting"] = spec["drafting"]
    try:
        engine = Engine.load(spec["bundle"], **load_kwargs)
    except EdgeSpecError as exc:
        return {"refused": str(exc), "rss_baseline": baseline, "peak_rss_at_refusal": peak_rss_bytes()}
    after_load = rss_bytes()
    plan = engine.describe() if hasattr(engine, "describe") else None
    temp = float(spec.get("temperature", 0.0))

    def one(ids: list[int], timer, seed: int):
        if hasattr(engine, "reset"):
            engine.reset()
        before = _snapshot(engine)
        out: list[int] = []
        kwargs: dict[str, Any] = {"max_new_tokens": spec["max_new_tokens"], "temperature": temp, "seed": seed,
                                  "speculative": bool(spec["speculative"])}
        if spec.get("gamma"):
            kwargs["draft_length"] = int(spec["gamma"])
        config = {"stop_token_ids": ()} if spec.get("ignore_stop") else None  # always the full token count
        for ev in engine.stream(ids, config, **kwargs):
            if ev.token_ids:
                timer.first()
                out.extend(int(t) for t in ev.token_ids)
        after = _snapshot(engine)
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in STAT_KEYS}
        hist_a, hist_b = after.get("gamma_hist", {}), before.get("gamma_hist", {})
        delta["gamma_hist"] = {str(g): hist_a.get(g, 0) - hist_b.get(g, 0) for g in hist_a
                               if hist_a.get(g, 0) - hist_b.get(g, 0)}
        return out, delta

    timer = run_prompts(spec, one)
    res: dict[str, Any] = {"runs": timer.runs, "rss_baseline": baseline, "rss_after_load": after_load,
                           "plan": plan, **summarise(timer.runs, spec["repeats"])}
    measured = [r for r in timer.runs if not r["warmup"]]
    tot = {k: sum(r.get(k, 0) for r in measured) for k in STAT_KEYS}
    res["engine_stats"] = tot
    if spec["speculative"] and tot["drafted"]:
        hist: dict[str, float] = {}
        for r in measured:
            for g, n in r.get("gamma_hist", {}).items():
                hist[g] = hist.get(g, 0) + n
        res["acceptance"] = tot["accepted"] / tot["drafted"]
        res["tokens_per_target_pass"] = tot["tokens"] / max(1.0, tot["target_passes"])
        res["gamma_hist"] = hist
        steps = sum(hist.values())
        res["gamma"] = sum(float(g) * n for g, n in hist.items()) / steps if steps else spec.get("gamma")
        res["drafter_ms_per_token"] = 1e3 * tot["drafter_seconds"] / tot["drafted"]
    return res
