"""The adaptive draft-length policy (``DraftPolicy``) against simulated drafters: how close it comes to the best
fixed draft length, which it does not know.

    python benchmarks/policy_sim.py [--steps 2000] [--seeds 5] [--time-noise 0.1] [--json out.json]

Each drafter is a profile of conditional acceptance by depth (the d-th draft accepted with probability a_d given
the d - 1 before it were): constant, falling (a feature drafter's, e.g. the SmolLM2 head's measured 0.52 / 0.44 /
0.40 / 0.28), rising (a layer drafter's, 0.40 / 0.48 / 0.60 / 0.68 / 0.77), or extreme. Costs, in units of one
target step: a draft pass ``--draft-cost`` (0.06: the head), a verify of g + 1 tokens 1 + ``--verify-slope`` * g
(0.03: the fast graph on 2 threads, where a 2-row verify costs about what a 1-row step does). Reports tokens per
target-step time relative to plain decoding (AR = 1), mean draft length after a 200-step warm-up, and the best
fixed draft length's expected value. As in the runtime, the first drafting step after plain steps is not timed
(the drafter catches up on what it skipped). A benchmark of the policy's decisions only: no model runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edge_spec.runtime.drafting import DraftPolicy  # noqa: E402

PROFILES = {
    "constant 0.3": [0.3], "constant 0.33": [0.33], "constant 0.6": [0.6],
    "falling (SmolLM2 head)": [0.52, 0.44, 0.40, 0.28], "rising (layer drafter)": [0.40, 0.48, 0.60, 0.68, 0.77],
    "first good, rest bad": [0.9, 0.05], "first hard, rest easy": [0.5, 0.95],
}


def simulate(profile: list[float], steps: int, seed: int, draft_cost: float, slope: float,
             max_gamma: int = 6, time_noise: float = 0.0) -> tuple[float, float]:
    """(speed relative to AR, mean draft length) of a fresh policy after a 200-step warm-up; the policy sees each
    step's time times exp(N(0, time_noise)) (a real machine's jitter), the speed counts the true costs."""
    rng = np.random.default_rng(seed)
    pol = DraftPolicy(max_gamma)
    tokens, seconds, gammas, prev = 0, 0.0, [], 0
    for i in range(steps):
        g = pol.next_gamma()
        m = 0
        while m < g and rng.random() < profile[min(m, len(profile) - 1)]:
            m += 1
        t_d, t_v = 0.01 * draft_cost * g, 0.01 * (1 + slope * g)
        # as in the runtime: the first drafting step after plain ones also catches the drafter up, so it is not timed
        seen_v = t_v * float(np.exp(rng.normal(0.0, time_noise))) if time_noise else t_v
        pol.update(g, m, t_d, seen_v, drafter_passes=g, timed=i > 0 and not (g and not prev))
        prev = g
        if i >= 200:
            tokens, seconds = tokens + m + 1, seconds + t_d + t_v
            gammas.append(g)
    return tokens / seconds / 100.0, float(np.mean(gammas))


def best_fixed(profile: list[float], draft_cost: float, slope: float, max_gamma: int = 6) -> tuple[float, int]:
    """(expected speed relative to AR, draft length) of the best fixed draft length."""
    best, arg, expected, power = 1.0, 0, 1.0, 1.0
    for g in range(1, max_gamma + 1):
        power *= profile[min(g - 1, len(profile) - 1)]
        expected += power
        rate = expected / (draft_cost * g + 1 + slope * g)
        if rate > best:
            best, arg = rate, g
    return best, arg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--draft-cost", type=float, nargs="+", default=[0.06, 0.05])
    ap.add_argument("--verify-slope", type=float, nargs="+", default=[0.03, 0.1])
    ap.add_argument("--time-noise", type=float, default=0.0,
                    help="sd of the log of each measured step time (0.1: this machine's 2-thread jitter)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for dc, slope in zip(args.draft_cost, args.verify_slope, strict=True):
        print(f"draft pass {dc:.2f} of a target step, verify +{slope:.2f} per drafted token, time noise "
              f"{args.time_noise}")
        for name, prof in PROFILES.items():
            runs = [simulate(prof, args.steps, s, dc, slope, time_noise=args.time_noise) for s in range(args.seeds)]
            speed, gamma = float(np.mean([r[0] for r in runs])), float(np.mean([r[1] for r in runs]))
            fixed, g = best_fixed(prof, dc, slope)
            rows.append({"draft_cost": dc, "verify_slope": slope, "profile": name, "accept_by_depth": prof,
                         "time_noise": args.time_noise, "speed_vs_ar": round(speed, 3), "mean_gamma": round(gamma, 2),
                         "best_fixed_speed": round(fixed, 3), "best_fixed_gamma": g})
            print(f"  {name:24s} policy {speed:.3f}x AR (mean gamma {gamma:.2f}); best fixed gamma {g}: {fixed:.3f}x "
                  f"({speed / fixed:.1%} of it)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
