"""Replay the target's greedy answers through model-free drafting rules: tokens per target pass, modelled speed.

    python benchmarks/probes/lookup_replay.py --answers models/coder-data/answers.npz --engine --by-source \
        --rules current oracle --costs 1 1.24 1.59 1.92 2.63 2.83 3.1 3.32 [--folds 4] [--share 0.5]

Greedy drafting needs no model to be judged: a draft is accepted as far as it equals what the target wrote next, so
the target's own greedy answers (the answers files of ``models/coder-data``) replay every rule exactly. Each answer
is decoded as the engine does — one committed token per plain step, a pass of ``pending + g`` rows for ``g`` drafts,
two pending rows after a step whose drafts were all accepted — with ``lookup_draft`` and the bundle's
:class:`NgramTable` built (``count_table``) from the *other* folds' answers, folds split by problem so no answer
drafts from its own problem in another language or phrasing. ``--costs`` is a pass's time by rows (1, 2, 3, ...
rows, relative to 1; ``benchmarks/verify_cost.py`` measures them). Reports tokens per pass and the modelled speed
over plain decoding (tokens / summed pass cost) per rule; ``--by-source`` the acceptance of each draft source by its
match length. A probe: what it finds is carried into ``edge_spec/runtime`` and measured there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_spec.export.ngrams import count_table  # noqa: E402
from edge_spec.runtime.drafting import lookup_draft  # noqa: E402
from edge_spec.runtime.ngrams import NgramTable, ngram_hash  # noqa: E402


def pass_cost(costs: list[float], rows: int) -> float:
    """Modelled time of a pass of ``rows`` rows: ``costs[rows - 1]``, beyond the list +30 % of its last a row."""
    return costs[min(rows, len(costs)) - 1] * (1 + max(0, rows - len(costs)) * 0.3)


def _match_len(tok: np.ndarray, n: int, kmax: int) -> tuple[int, int]:
    """(k, start): the longest k <= kmax whose last-k-token window occurs earlier, and where its continuation starts."""
    for k in range(min(kmax, n - 1), 0, -1):
        tail = tok[n - k:n]
        hits = tok[:n - k] == tail[0]
        for j in range(1, k):
            hits &= tok[j:n - k + j] == tail[j]
        idx = np.flatnonzero(hits)
        if len(idx):
            return k, int(idx[-1]) + k
    return 0, -1


def _table_draft(table: NgramTable, tok: np.ndarray, n: int, g: int) -> tuple[np.ndarray, int]:
    """The table's draft and the length of the n-gram its first token came from (0: none)."""
    ctx = [int(t) for t in tok[max(0, n - table.max_n):n]]
    first_n = 0
    for k in range(min(table.max_n, len(ctx)), table.min_n - 1, -1):
        h = np.uint64(ngram_hash(ctx[len(ctx) - k:]))
        i = int(np.searchsorted(table.keys, h))
        if i < len(table.keys) and table.keys[i] == h:
            first_n = k
            break
    return table.draft(tok, n, g), first_n


RULES = {
    # name: (prompt-lookup kmax, prompt-lookup kmin, table on, max drafts by match length {k: g}, default g)
    "plain": None,
    "current": dict(kmax=3, kmin=1, table=True, gamma={}, g=4),
    "current-g2": dict(kmax=3, kmin=1, table=True, gamma={}, g=2),
    "current-g1": dict(kmax=3, kmin=1, table=True, gamma={}, g=1),
    "min2": dict(kmax=3, kmin=2, table=True, gamma={}, g=4),
    "k1-short": dict(kmax=3, kmin=1, table=True, gamma={1: 1, 2: 2}, g=4),
    "kmax6": dict(kmax=6, kmin=1, table=True, gamma={1: 1, 2: 2}, g=6),
    "kmax6-min2": dict(kmax=6, kmin=2, table=True, gamma={2: 2}, g=6),
    "kmax8-long": dict(kmax=8, kmin=1, table=True, gamma={1: 1, 2: 2, 3: 3}, g=8),
    "no-table": dict(kmax=3, kmin=1, table=False, gamma={}, g=4),
    "table-first": dict(kmax=3, kmin=1, table=True, gamma={}, g=4, table_first=True),
    "goodput": dict(kmax=3, goodput=True),
    "goodput-k6": dict(kmax=6, goodput=True),
    "oracle": dict(kmax=6, oracle=True),
}


class Goodput:
    """Source and draft length by expected goodput: acceptance of a draft's first token learnt per (source, match
    length), of later tokens per source; a step drafts the (source, g) maximising E(g) - R c(pending + g), R the
    tokens per unit cost so far (Dinkelbach's rule for the long-run ratio), or nothing when no draft beats that."""

    def __init__(self, costs: list[float], prior: float = 0.5, weight: float = 4.0) -> None:
        self.costs = costs
        self.first: dict = defaultdict(lambda: [prior * weight, weight])
        self.cont: dict = defaultdict(lambda: [prior * weight, weight])
        self.tokens, self.cost = 1.0, 1.0

    def c(self, rows: int) -> float:
        return pass_cost(self.costs, rows)

    def choose(self, cands: list, pending: int) -> tuple:
        rate = self.tokens / self.cost
        best, best_v = (None, 0), 1.0 - rate * self.c(pending)
        for key, d in cands:
            a1 = self.first[key][0] / self.first[key][1]
            ac = self.cont[key[0]][0] / self.cont[key[0]][1]
            e, p = 1.0, 1.0
            for g in range(1, len(d) + 1):
                p *= a1 if g == 1 else ac
                e += p
                v = e - rate * self.c(pending + g)
                if v > best_v:
                    best, best_v = (key, g), v
        return best

    def update(self, key: tuple, g: int, acc: int, tokens: int, cost: float) -> None:
        self.tokens += tokens
        self.cost += cost
        if key is None:
            return
        f = self.first[key]
        f[0] += acc > 0
        f[1] += 1
        tried = min(acc + 1, g) - 1  # later depths tried: the accepted ones after the first, and the first rejected
        if tried > 0:
            c = self.cont[key[0]]
            c[0] += min(acc, g) - 1 if acc > 0 else 0
            c[1] += tried


def replay(seq: np.ndarray, prompt_len: int, table: NgramTable | None, rule: dict | None, costs: list[float],
           stats: dict, policy: Goodput | None = None) -> tuple[int, float, int]:
    """(tokens produced, summed pass cost, passes) for one answer; the prefill's first token is not counted."""
    n, end = prompt_len + 1, len(seq)
    produced, cost, passes, pending = 0, 0.0, 0, 1
    while n < end:
        g_max = min(end - n, 8)
        draft, src = seq[:0], ("none", 0)
        if rule is not None and (rule.get("goodput") or rule.get("oracle")) and g_max > 0:
            k, _ = _match_len(seq, n, rule["kmax"])
            cands = []
            if k:
                cands.append((("prompt", k), lookup_draft(seq, n, g_max, ngram_max=rule["kmax"], ngram_min=1)))
            if table is not None:
                tdraft, tn = _table_draft(table, seq, n, g_max)
                if len(tdraft):
                    cands.append((("table", tn), tdraft))
            if rule.get("oracle"):
                right = [(int(np.cumprod(d == seq[n:n + len(d)]).sum()), key, d) for key, d in cands]
                r, key, d = max(right, key=lambda x: x[0], default=(0, None, None))
                if r:
                    draft, src = d[:r], key
            else:
                key, g = policy.choose(cands, pending)
                if key is not None:
                    draft, src = dict(cands)[key][:g], key
        elif rule is not None and g_max > 0:
            k, start = _match_len(seq, n, rule["kmax"])
            tdraft, tn = (_table_draft(table, seq, n, rule["g"]) if rule["table"] and table is not None
                          else (seq[:0], 0))
            use_table = rule.get("table_first") and len(tdraft) and tn >= 3
            if k >= rule["kmin"] and not use_table:
                g = min(rule["gamma"].get(k, rule["g"]), g_max)
                draft, src = lookup_draft(seq, n, g, ngram_max=rule["kmax"], ngram_min=rule["kmin"]), ("prompt", k)
            elif len(tdraft):
                draft, src = tdraft[:g_max], ("table", tn)
        g = len(draft)
        acc = 0
        while acc < g and draft[acc] == seq[n + acc]:
            acc += 1
        if g:
            s = stats[src]
            s[0] += 1
            s[1] += acc > 0
            s[2] += acc
            s[3] += g
        rows = pending + g
        step_cost = pass_cost(costs, rows)
        cost += step_cost
        passes += 1
        step = min(acc + 1, end - n)
        if policy is not None:
            policy.update(src if g else None, g, acc, step, step_cost)
        n += step
        produced += step
        pending = 2 if g and acc == g else 1
    return produced, cost, passes


class _Clock:
    """A virtual ``time`` for the decode loop: a pass advances it by its modelled cost."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class _Oracle:
    """The target's stand-in for greedy replay: row i of a pass is one-hot at the recorded token after its position
    (the greedy target's choice whenever the committed context is the recorded one, as lossless decoding keeps it);
    a pass of k rows advances the clock by ``cost(k)``. No padding row (``guess_free`` False), as the coder graph."""

    max_rows = 16
    guess_rows = 2
    guess_free = False

    def __init__(self, vocab: int, capacity: int, clock: _Clock, cost) -> None:
        self.vocab_size, self.capacity, self.clock, self.cost = vocab, capacity, clock, cost
        self.length, self.seq, self.end_id = 0, np.zeros(1, np.int64), 0

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        k = len(tokens)
        pos = np.arange(self.length + 1, self.length + k + 1)
        out = np.zeros((k, self.vocab_size), np.float32)
        out[np.arange(k), np.where(pos < len(self.seq), self.seq[np.minimum(pos, len(self.seq) - 1)],
                                   self.end_id)] = 1.0
        self.length += k
        self.clock.t += self.cost(k)
        return out

    def rewind_to(self, n: int) -> None:
        self.length = n


def engine_replay(seqs: list, tables: list, vocab: int, costs: list[float], gamma: int = 8) -> tuple[float, float]:
    """Run the runtime's own decode loop (``edge_spec.runtime.speculative.decode``, lookup drafting, the engine's
    policies, kept across answers as one engine keeps them) over ``seqs`` = (ids, prompt_len, fold) with each
    fold's table; returns (tokens per pass, modelled speed over plain) over the decode steps."""
    from edge_spec.runtime import speculative
    from edge_spec.runtime.drafting import DraftPolicy
    from edge_spec.runtime.sampling import Noise
    from edge_spec.sampling_config import SamplingConfig

    clock = _Clock()
    speculative.time = clock  # the loop's timings become modelled costs

    target = _Oracle(vocab, 4096, clock, lambda k: pass_cost(costs, k))
    policy, guesser = DraftPolicy(gamma, free_drafts=True), DraftPolicy(1, free_drafts=True)
    tokens = passes = 0
    spent = 0.0
    for ids, prompt_len, f in seqs:
        dec = speculative.Decoder(target, None, lookup=True, max_gamma=gamma, table=tables[f])
        target.seq, target.end_id = ids, int(ids[-1])
        target.length = 0
        dec.set_context(ids[:prompt_len])
        first = True
        for step in speculative.decode(dec, SamplingConfig(), policy, Noise(0, vocab), len(ids) - prompt_len,
                                       frozenset(), guesser=guesser):
            if first:  # the prefill's pass (its cost is not a decode step's)
                first = False
                continue
            tokens += len(step.tokens)
            passes += 1
            spent += dec.t_verify
    return tokens / passes, tokens / spent


def main(argv: list[str] | None = None) -> int:
    from edge_spec.distill.ids import read_many

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", type=Path, nargs="+", required=True)
    ap.add_argument("--costs", type=float, nargs="+", default=[1.0, 1.10, 1.30, 1.55, 1.85])
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--problems", type=int, default=24, help="prompts per problem in prompts.txt (8 languages x 3)")
    ap.add_argument("--rules", nargs="+", default=list(RULES))
    ap.add_argument("--by-source", action="store_true")
    ap.add_argument("--share", type=float, default=1.0, help="build each table from this share of the other folds")
    ap.add_argument("--engine", action="store_true", help="also replay the runtime's own decode loop and policies")
    args = ap.parse_args(argv)
    train, held, meta = read_many(args.answers)
    seqs = train + held
    idx = meta.get("prompt_indices") or list(range(len(seqs)))
    if len(idx) != len(seqs):
        idx = list(range(len(seqs)))
    fold = [(i // args.problems) % args.folds for i in idx]
    out: dict = {}
    if args.engine:
        ids_all = np.unique(np.concatenate([np.asarray(x.ids, np.int64) for x in seqs]))
        remap = np.zeros(int(ids_all.max()) + 1, np.int64)
        remap[ids_all] = np.arange(len(ids_all))  # compact ids: one-hot rows of the kept tokens only
        comp = [(remap[np.asarray(x.ids, np.int64)], x.prompt_len) for x in seqs]
        tables = []
        from edge_spec.export.ngrams import guess_table
        for f in range(args.folds):
            rest = [c for i, (c, ff) in enumerate(zip(comp, fold)) if ff != f and (i * 7919) % 1000 < 1000 * args.share]
            keys, nxt = count_table(rest)
            tables.append(NgramTable(keys, nxt, 2, 4, guess_table(rest, len(ids_all))))
        tpp, speed = engine_replay([(c[0], c[1], ff) for c, ff in zip(comp, fold)], tables, len(ids_all), args.costs)
        out["engine"] = {"tokens_per_pass": round(tpp, 3), "speed_over_plain": round(speed, 3)}
        print(f"{'engine':14s} tokens/pass {tpp:.3f}  modelled speed over plain {speed:.3f}", flush=True)
    for name in args.rules:
        rule = RULES[name]
        tokens = cost = passes = 0
        stats: dict = defaultdict(lambda: [0, 0, 0, 0])
        policy = Goodput(args.costs) if rule is not None and rule.get("goodput") else None
        for f in range(args.folds):
            rest = [(s.ids, s.prompt_len) for s, ff in zip(seqs, fold) if ff != f]
            keys, nxt = count_table(rest)
            table = NgramTable(keys, nxt, 2, 4)
            for s, ff in zip(seqs, fold):
                if ff == f:
                    a, b, c = replay(np.asarray(s.ids, np.int64), s.prompt_len, table, rule, args.costs, stats, policy)
                    tokens, cost, passes = tokens + a, cost + b, passes + c
        out[name] = {"tokens_per_pass": round(tokens / passes, 3), "speed_over_plain": round(tokens / cost, 3)}
        line = f"{name:14s} tokens/pass {tokens / passes:.3f}  modelled speed over plain {tokens / cost:.3f}"
        print(line, flush=True)
        if args.by_source:
            for src, (drafts, first, acc, g) in sorted(stats.items()):
                print(f"    {src[0]:6s} k={src[1]}: {drafts:6d} drafts, first right {first / drafts:.2f}, "
                      f"accepted {acc / g:.2f} of {g / drafts:.1f} drafted")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
