"""Where each millisecond of a speculative step goes: drafter, target verify, sampling/acceptance, Python.

    python benchmarks/lib/profile_spec.py --bundle BUNDLE [--prompts 4] [--tokens 128] [--threads 2] \
        [--gammas auto 4] [--temperature 0] [--drafting auto|model|lookup] [--json OUT.json]

Runs ``Engine.stream`` on held-out chat prompts (ids from the bundle's chat format, stop tokens
ignored so every prompt makes ``--tokens`` tokens) with the engine's own pieces timed by
``perf_counter`` hooks installed on the classes for the duration of the run (nothing in the
runtime is changed): ``Decoder.draft`` / ``draft_lookup`` / ``verify`` / ``accept``, ``DraftPolicy.update`` and
``ModelSession.forward``, whose ``run_seconds`` separates ONNX Runtime's own time from the
binding and Python around it. A step is the time between two events of the stream; the first
step of each prompt (it prefills the prompt) is left out. ``--gammas``: ``auto`` is the adaptive
draft-length policy the benchmarks report; a number fixes the draft length, so the cost of a
speculative step is visible even when the policy would switch speculation off. Steps are grouped
by where their drafts came from: the drafter model, prompt lookup (hybrid drafting, the default),
or none (plain steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.lib.prompts import CHAT_PROMPTS, chat_messages  # noqa: E402
from edge_spec import Engine  # noqa: E402
from edge_spec.runtime.drafting import DraftPolicy  # noqa: E402
from edge_spec.runtime.session import ModelSession  # noqa: E402
from edge_spec.runtime.speculative import Decoder  # noqa: E402

# (label, key) rows of the table, in step order; "loop" is the step's wall time minus all the others
COMPONENTS = (
    ("drafter: ONNX Runtime", "drafter_ort"),
    ("drafter: binding + Python in forward()", "drafter_bind"),
    ("drafting logic (argmax / sampling, id map, lookup)", "draft_logic"),
    ("target verify: ONNX Runtime", "target_ort"),
    ("target: binding + Python in forward()", "target_bind"),
    ("acceptance + sampling (probs, verify rule)", "verify_logic"),
    ("commit + KV rewind (accept)", "accept"),
    ("draft-length policy", "policy"),
    ("loop, stream events, detokenizer", "loop"),
)


class Hooks:
    """perf_counter accumulators on the runtime's classes; ``install()`` / ``remove()`` around a run."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.acc: dict[str, float] = defaultdict(float)
        self.passes: list[tuple[str, int, float]] = []  # (model, rows fed, ORT seconds) of every forward
        self._orig: list[tuple[type, str, Any]] = []

    def _wrap(self, cls: type, name: str, key: str, after: Any = None) -> None:
        orig = getattr(cls, name)
        acc = self.acc

        def timed(obj: Any, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = orig(obj, *a, **kw)
            acc[key] += time.perf_counter() - t0
            if after is not None:
                after(obj, a, out)
            return out

        self._orig.append((cls, name, orig))
        setattr(cls, name, timed)

    def install(self) -> None:
        eng, acc = self.engine, self.acc

        def on_draft(dec: Any, a: tuple, g: int) -> None:
            acc["drafted"] += g
            acc["gamma_last"] = g
            acc["lookup_last"] = float(dec.deterministic)  # the lookup rung drafts through draft() too

        orig_lookup = Decoder.draft_lookup

        def draft_lookup(dec: Decoder, gamma: int) -> int:  # hybrid drafting calls it directly, before draft()
            t0 = time.perf_counter()
            g = orig_lookup(dec, gamma)
            if dec.drafter is not None:  # (with no drafter it runs inside draft(), timed and counted there)
                acc["lookup"] += time.perf_counter() - t0
                acc["drafted"] += g
                acc["gamma_last"] = g
                acc["lookup_last"] = 1.0
            return g

        def on_verify(_: Any, a: tuple, out: tuple[int, int]) -> None:
            acc["accepted"] += out[0]

        orig_forward = ModelSession.forward

        def forward(session: ModelSession, tokens: Any, features: Any = None, keep: int = 0) -> Any:
            who = "target" if session is eng.target else "drafter"
            ort0 = session.run_seconds
            t0 = time.perf_counter()
            # features: an EAGLE-3 drafter's target features; keep: the logits rows a prefill chunk asks for
            out = orig_forward(session, tokens, features, keep)
            wall = time.perf_counter() - t0
            ort = session.run_seconds - ort0
            acc[f"{who}_fwd"] += wall
            acc[f"{who}_ort"] += ort
            acc[f"{who}_passes"] += 1
            self.passes.append((who, len(tokens), ort))
            return out

        self._orig.append((Decoder, "draft_lookup", orig_lookup))
        Decoder.draft_lookup = draft_lookup  # type: ignore[method-assign]
        self._wrap(Decoder, "draft", "draft", on_draft)
        self._wrap(Decoder, "verify", "verify", on_verify)
        self._wrap(Decoder, "accept", "accept")
        self._wrap(DraftPolicy, "update", "policy")
        self._orig.append((ModelSession, "forward", orig_forward))
        ModelSession.forward = forward  # type: ignore[method-assign]

    def remove(self) -> None:
        for cls, name, orig in reversed(self._orig):
            setattr(cls, name, orig)
        self._orig.clear()


def profile(engine: Engine, prompts: list[list[int]], gamma: int | None, tokens: int,
            temperature: float) -> dict[str, Any]:
    """Per-step records of ``len(prompts)`` generations of ``tokens`` tokens; the prefill step is dropped."""
    kwargs = {"max_new_tokens": tokens, "temperature": temperature, "seed": 0, "speculative": True,
              "draft_length": gamma}
    for _ in engine.stream(prompts[0], {"stop_token_ids": ()}, **{**kwargs, "max_new_tokens": 16}):
        pass  # warm-up: first-run allocations, and the adaptive policy measures its step costs
    hooks = Hooks(engine)
    steps: list[dict[str, float]] = []
    hooks.install()
    try:
        for ids in prompts:
            engine.reset()
            before = dict(hooks.acc)
            t_prev = time.perf_counter()
            for i, ev in enumerate(engine.stream(ids, {"stop_token_ids": ()}, **kwargs)):
                now = time.perf_counter()
                cur = dict(hooks.acc)
                d = {k: cur.get(k, 0.0) - before.get(k, 0.0) for k in cur}
                d.update(wall=now - t_prev, tokens=len(ev.token_ids), gamma=cur.get("gamma_last", 0),
                         from_lookup=cur.get("lookup_last", 0.0))
                hooks.acc["gamma_last"] = hooks.acc["lookup_last"] = 0.0  # a step that drafts nothing sets neither
                if i > 0:  # the first step prefills the prompt
                    steps.append(d)
                before, t_prev = cur, time.perf_counter()  # consumer time between events is not the engine's
    finally:
        hooks.remove()
    verify_ms: dict[int, list[float]] = defaultdict(list)
    for who, rows, ort in hooks.passes:
        if who == "target":
            verify_ms[rows].append(1e3 * ort)
    drafter_ms = [1e3 * ort for who, _, ort in hooks.passes if who == "drafter"]
    return {"steps": steps, "target_pass_ms": {k: statistics.median(v) for k, v in sorted(verify_ms.items())},
            "target_pass_count": {k: len(v) for k, v in sorted(verify_ms.items())},
            "drafter_pass_ms": statistics.median(drafter_ms) if drafter_ms else None,
            "min_rows": getattr(engine.target, "min_rows", 1)}


def breakdown(steps: list[dict[str, float]]) -> dict[str, float]:
    """Mean milliseconds per step of each component (COMPONENTS keys), plus totals."""
    n = max(1, len(steps))

    def mean(key: str) -> float:
        return 1e3 * sum(s.get(key, 0.0) for s in steps) / n

    out = {"drafter_ort": mean("drafter_ort"), "drafter_bind": mean("drafter_fwd") - mean("drafter_ort"),
           "draft_logic": mean("draft") + mean("lookup") - mean("drafter_fwd"), "target_ort": mean("target_ort"),
           "target_bind": mean("target_fwd") - mean("target_ort"), "verify_logic": mean("verify") - mean("target_fwd"),
           "accept": mean("accept"), "policy": mean("policy")}
    out["total"] = mean("wall")
    out["loop"] = out["total"] - (mean("draft") + mean("lookup") + mean("verify") + mean("accept") + mean("policy"))
    out["tokens"] = sum(s["tokens"] for s in steps) / n
    out["drafter_passes"] = sum(s.get("drafter_passes", 0) for s in steps) / n
    out["gamma"] = sum(s["gamma"] for s in steps) / n
    drafted = sum(s.get("drafted", 0) for s in steps)
    out["acceptance"] = sum(s.get("accepted", 0) for s in steps) / drafted if drafted else float("nan")
    out["steps"] = len(steps)
    return out


def table(name: str, res: dict[str, Any]) -> str:
    """Markdown: ms per step by component for speculative steps, plain steps and all steps."""
    groups = {"drafter steps": [s for s in res["steps"] if s["gamma"] > 0 and not s["from_lookup"]],
              "lookup steps": [s for s in res["steps"] if s["gamma"] > 0 and s["from_lookup"]],
              "plain steps (gamma 0)": [s for s in res["steps"] if s["gamma"] == 0],
              "all steps": res["steps"]}
    cols = {k: breakdown(v) for k, v in groups.items() if v}
    head = " | ".join(f"{k} ms | %" for k in cols)
    lines = [f"**{name}**", "", f"| component | {head} |", "|---|" + "---:|---:|" * len(cols)]
    for label, key in COMPONENTS:
        cells = " | ".join(f"{c[key]:.2f} | {100 * c[key] / max(c['total'], 1e-12):.0f}" for c in cols.values())
        lines.append(f"| {label} | {cells} |")
    lines.append("| **step total** | " + " | ".join(f"**{c['total']:.2f}** | 100" for c in cols.values()) + " |")
    for label, key, fmt in (("steps measured", "steps", "{:.0f}"), ("mean gamma", "gamma", "{:.2f}"),
                            ("drafter passes / step", "drafter_passes", "{:.2f}"), ("acceptance", "acceptance",
                                                                                     "{:.2f}"),
                            ("tokens / step", "tokens", "{:.2f}")):
        lines.append(f"| {label} | " + " | ".join(fmt.format(c[key]) + " | " for c in cols.values()) + "|")
    lines.append("| **ms / token** | " + " | ".join(f"**{c['total'] / max(c['tokens'], 1e-9):.2f}** | "
                                                    for c in cols.values()) + "|")
    passes = ", ".join(f"{k} rows {v:.2f} ms (x{res['target_pass_count'][k]})"
                       for k, v in res["target_pass_ms"].items())
    dp = res["drafter_pass_ms"]
    pad = res.get("min_rows", 1)
    padded = f" (passes of fewer than {pad} tokens run padded to {pad} rows)" if pad > 1 else ""
    lines += ["", f"Target pass, ONNX Runtime time by tokens fed, prefill chunks included (median){padded}: {passes}.",
              f"Drafter pass (median): {'—' if dp is None else f'{dp:.2f} ms'}."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gammas", nargs="+", default=["auto", "4"], help="'auto' (adaptive policy) or draft lengths")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--drafting", default="auto", choices=("auto", "model", "lookup"),
                    help="Engine.load(drafting=...): auto = hybrid (drafter + lookup), model = drafter only")
    ap.add_argument("--json", type=Path, help="also write the per-step records here")
    args = ap.parse_args()
    from edge_spec.bundle import read_manifest

    engine = Engine.load(args.bundle, threads=args.threads, drafting=args.drafting)
    chat = read_manifest(args.bundle).tokenizer.chat
    prompts = [engine.encode_chat(chat_messages(p)) if chat else engine.tokenizer.encode(p).ids
               for p in CHAT_PROMPTS[:args.prompts]]
    print(f"{args.prompts} chat prompts x {args.tokens} tokens, {args.threads} threads, T={args.temperature:g}, "
          f"drafting={args.drafting}; "
          f"{engine.plan.describe().splitlines()[0]}\n")
    results = {}
    for g in args.gammas:
        gamma = None if g == "auto" else int(g)
        res = profile(engine, prompts, gamma, args.tokens, args.temperature)
        results[g] = res
        print(table("adaptive draft length" if gamma is None else f"fixed draft length {gamma}", res) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
