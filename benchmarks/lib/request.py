"""One timed request to each kind of system the alternating benchmarks (``spec_ab.py``, ``decode_ab.py``) hold
loaded at once: an edge-spec ``Engine`` or a ``llama-server`` (:class:`benchmarks.lib.llamacpp.LlamaServer`).

Both return the same fields: ``prefill_s`` (edge-spec: time to the first token; llama.cpp: its ``prompt_ms`` plus one
token's share of ``predicted_ms``, its first token, which edge-spec's time to the first token also holds),
``decode_s`` (the tokens after the first), ``tokens``, ``token_ids`` and the drafting counters ``drafted`` /
``accepted`` (edge-spec: also ``target_passes``). Every request ignores the stop tokens, so each makes ``tokens``
tokens, and is seeded by the caller.
"""

from __future__ import annotations

import time
from typing import Any


def edge_request(engine: Any, ids: list[int], tokens: int, temperature: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """One request through ``Engine.stream``: times, token ids and the engine's drafting counters."""
    engine.reset()
    before = {k: getattr(engine.stats, k) for k in ("drafted", "accepted", "target_passes")}
    start = time.perf_counter()
    first = None
    out: list[int] = []
    for ev in engine.stream(ids, {"stop_token_ids": ()}, max_new_tokens=tokens, temperature=temperature, seed=seed):
        if ev.token_ids:
            if first is None:
                first = time.perf_counter()
            out.extend(int(t) for t in ev.token_ids)
    end = time.perf_counter()
    assert first is not None and len(out) > 1
    stats = {k: getattr(engine.stats, k) - v for k, v in before.items()}
    return {"prefill_s": first - start, "decode_s": end - first, "tokens": len(out), "token_ids": out, **stats}


def llama_request(server: Any, ids: list[int], tokens: int, temperature: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """The same request through llama-server's /completion, timed by its own ``timings`` (HTTP excluded)."""
    r = server.complete(ids, tokens, temperature=temperature, seed=seed, extra={"ignore_eos": True})
    t = r["timings"]
    n = int(t["predicted_n"])
    per = t["predicted_ms"] / 1e3 / n
    return {"prefill_s": t["prompt_ms"] / 1e3 + per, "decode_s": per * (n - 1), "tokens": n,
            "token_ids": [int(x) for x in r.get("tokens", [])], "drafted": int(t.get("draft_n", 0) or 0),
            "accepted": int(t.get("draft_n_accepted", 0) or 0)}
