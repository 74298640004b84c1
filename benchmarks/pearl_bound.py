"""Two cores, two jobs? The best a parallel draft-verify schedule (PEARL) could do, measured against ours.

    python benchmarks/pearl_bound.py --bundle BUNDLE [--context 256] [--repeats 100] [--json OUT]

PEARL (../shared/PAPERS.md) runs the drafter on one core while the target verifies on the other: a round costs
``max(verify on 1 core, gamma draft steps on 1 core)`` if every draft of the round is accepted (its best case; a
rejection throws the overlapped drafts away and the round costs what a plain one does), against our plain
schedule's ``gamma draft steps on 1 core + verify on all cores`` (the target spinning on 2 threads, the default).
Tokens per round are the same in both, so if even the best case is not faster than the plain round, PEARL cannot
win on this machine, whatever the acceptance.

Both schedules run here on the real passes of ``BUNDLE`` (its target graph, its drafter graph), at a fixed
position after a ``--context``-token prefill, cursors rewound after every round, interleaved so machine noise
hits both alike; the overlapped round runs the verify and the drafts in two Python threads (ONNX Runtime releases
the GIL inside ``run``), each session on one intra-op thread. Median of ``--repeats`` rounds per draft length.
A feature (EAGLE-3) drafter cannot draft before the target's verify of the previous round has produced its
features, so for it only the layer-drafter shape of the bound applies; the script says so and stops.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--max-draft", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.session import ModelSession, shared_initializers

    m = read_manifest(args.bundle)
    if m.drafter is None or m.drafter.kind == "eagle3":
        print(f"{args.bundle}: the bound needs a drafter that drafts from tokens alone (a layer drafter); "
              "an EAGLE-3 head waits for the target's features", file=sys.stderr)
        return 2
    shared = shared_initializers(args.bundle, m)
    cap = args.context + 64
    kw = dict(providers=["CPUExecutionProvider"], device="cpu", capacity=cap, max_rows=16, initializers=shared)
    rows = m.target.batch_invariant_rows or 1
    target_2 = ModelSession(args.bundle / m.target.graph, m.target, min_rows=rows, threads=2, spin=True, **kw)
    target_1 = ModelSession(args.bundle / m.target.graph, m.target, min_rows=rows, threads=1, **kw)
    drafter = ModelSession(args.bundle / m.drafter.graph, m.drafter, min_rows=m.drafter.batch_invariant_rows or 1,
                           threads=1, **kw)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, min(5000, m.drafter.vocab_size), size=args.context)
    for s in (target_2, target_1, drafter):
        for a in range(0, args.context, 16):
            s.forward(prompt[a:a + 16])
    n = args.context
    tok = prompt[:16]

    def drafts(gamma: int) -> None:
        for i in range(gamma):
            drafter.forward(tok[i:i + 1])

    def plain(gamma: int) -> float:
        t0 = time.perf_counter()
        drafts(gamma)
        target_2.forward(tok[:gamma + 1])
        dt = time.perf_counter() - t0
        drafter.rewind_to(n)
        target_2.rewind_to(n)
        return dt

    def overlapped(gamma: int) -> float:
        t0 = time.perf_counter()
        worker = threading.Thread(target=drafts, args=(gamma,))
        worker.start()
        target_1.forward(tok[:gamma + 1])
        worker.join()
        dt = time.perf_counter() - t0
        drafter.rewind_to(n)
        target_1.rewind_to(n)
        return dt

    def alone(session: ModelSession, k: int) -> float:
        t0 = time.perf_counter()
        session.forward(tok[:k])
        dt = time.perf_counter() - t0
        session.rewind_to(n)
        return dt

    gammas = range(1, args.max_draft + 1)
    times: dict[str, list[float]] = {}
    for rep in range(args.repeats + 5):  # 5 warm-up rounds
        for g in gammas:
            for name, fn in ((f"plain γ={g}", lambda g=g: plain(g)), (f"overlapped γ={g}", lambda g=g: overlapped(g)),
                             (f"verify {g + 1} rows, 2 threads", lambda g=g: alone(target_2, g + 1)),
                             (f"verify {g + 1} rows, 1 thread", lambda g=g: alone(target_1, g + 1))):
                dt = fn()
                if rep >= 5:
                    times.setdefault(name, []).append(dt)
        if rep >= 5:
            times.setdefault("draft step, 1 thread", []).append(alone(drafter, 1))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"bundle {args.bundle}, position {args.context}, median of {args.repeats} rounds (ms)")
    print("| draft length γ | plain round (drafts 1 thread + verify 2 threads) | PEARL best case (overlapped) | "
          "best case / plain |\n|---|---|---|---|")
    for g in gammas:
        p, o = med[f"plain γ={g}"], med[f"overlapped γ={g}"]
        print(f"| {g} | {p:.2f} | {o:.2f} | {o / p:.2f}x |")
    print("| pass | ms |\n|---|---|")
    for k, v in med.items():
        if not k.startswith(("plain", "overlapped")):
            print(f"| {k} | {v:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"median_ms": med, "context": args.context, "repeats": args.repeats,
                                         "bundle": str(args.bundle)}, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
