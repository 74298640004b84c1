"""What reading the target costs: a feature drafter's step against a target step, and the target's feature output.

    python benchmarks/feature_cost.py --bundle BUNDLE [--threads 2] [--context 256] [--repeats 200]

On a bundle whose drafter is an EAGLE-3 head (manifest ``kind: "eagle3"``), in one process, interleaved so that
machine noise hits every variant alike (median of ``--repeats`` passes each, at a fixed position after a
``--context``-token prefill; the cursor is rewound after every pass, as the runtime does):
* target 1-token step with its ``hidden_states`` output bound (what speculation pays) and unbound (plain AR);
* target 2-row pass (the verify of one draft);
* drafter own-output step (1 row: every draft after the first) and a 2-row feature pass (the catch-up after an
  accepted draft, which also yields the first draft's logits).
Prints a table and, with ``--json``, writes it. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.session import ModelSession, shared_initializers

    m = read_manifest(args.bundle)
    if m.drafter is None or m.drafter.kind != "eagle3":
        print(f"{args.bundle} has no EAGLE-3 drafter", file=sys.stderr)
        return 2
    shared = shared_initializers(args.bundle, m)
    cap = args.context + 64
    kw = dict(providers=["CPUExecutionProvider"], device="cpu", capacity=cap, max_rows=16, threads=args.threads,
              initializers=shared)
    rows = m.target.batch_invariant_rows or 1
    t_feat = ModelSession(args.bundle / m.target.graph, m.target, min_rows=rows, features=True, **kw)
    t_plain = ModelSession(args.bundle / m.target.graph, m.target, min_rows=rows, **kw)
    d = ModelSession(args.bundle / m.drafter.graph, m.drafter, **kw)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, min(5000, m.target.vocab_size), size=args.context)
    for t in (t_feat, t_plain):
        for a in range(0, args.context, 16):
            t.forward(prompt[a:a + 16])
    assert t_feat.features is not None
    for a in range(0, args.context - 1, 16):
        b = min(args.context - 1, a + 16)
        d.forward(prompt[a + 1:b + 1], t_feat.features[a:b])
    n_t, n_d = t_feat.length, d.length
    tok = prompt[-2:]
    feats = np.ascontiguousarray(t_feat.features[n_d - 2:n_d])

    def timed(fn, model, n) -> float:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        model.rewind_to(n)
        return dt

    cases = {
        "target step, features bound": (lambda: t_feat.forward(tok[:1]), t_feat, n_t),
        "target step, features unbound": (lambda: t_plain.forward(tok[:1]), t_plain, n_t),
        "target 2-row pass (verify 1 draft), features bound": (lambda: t_feat.forward(tok), t_feat, n_t),
        "drafter own-output step (1 row)": (lambda: d.forward(tok[:1]), d, n_d),
        "drafter feature pass (2 rows, catch-up)": (lambda: d.forward(tok, feats), d, n_d),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(5):  # warm-up
        for fn, model, n in cases.values():
            timed(fn, model, n)
    for _ in range(args.repeats):
        for name, (fn, model, n) in cases.items():
            times[name].append(timed(fn, model, n))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    step = med["target step, features unbound"]
    print(f"bundle {args.bundle}, {args.threads} threads, position {args.context}, median of {args.repeats}")
    print("| pass | ms | vs target step |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v / step:.1%} |")
    if args.json:
        args.json.write_text(json.dumps({"median_ms": med, "threads": args.threads, "context": args.context,
                                         "repeats": args.repeats}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
