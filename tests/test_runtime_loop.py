"""The draft-verify loop against scripted fake models behind the backend seam (no ONNX Runtime)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_spec.runtime.drafting import DraftPolicy, lookup_draft
from edge_spec.runtime.sampling import Noise, Rejection, SamplingConfig, draft_sampling
from edge_spec.runtime.speculative import Decoder, decode

V = 12


def table_logits(seed: int, noise: float = 0.0) -> np.ndarray:
    """Logits as a function of the last two tokens: a [V, V, V] table."""
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(0).normal(0, 2.0, size=(V, V, V))
    return base + noise * rng.normal(0, 2.0, size=(V, V, V))


class FakeModel:
    """A model that takes tokens and returns logits; records every pass it gets."""

    def __init__(self, table: np.ndarray, capacity: int = 64, max_rows: int = 8, id_map: np.ndarray | None = None):
        self.table, self.capacity, self.max_rows = table, capacity, max_rows
        self.id_map = id_map
        self.vocab_size = table.shape[-1] if id_map is None else len(id_map)
        self.length = 0
        self.history: list[int] = []  # what the KV "holds"
        self.passes: list[list[int]] = []
        self.out = np.zeros((max_rows, self.vocab_size))

    def forward(self, tokens):
        tokens = [int(t) for t in tokens]
        assert 0 < len(tokens) <= self.max_rows and self.length + len(tokens) <= self.capacity
        del self.history[self.length:]
        self.passes.append(tokens)
        for i, t in enumerate(tokens):
            self.history.append(t)
            prev = self.history[-2] if len(self.history) > 1 else 0
            row = self.table[prev, t]
            self.out[i] = row if self.id_map is None else row[self.id_map]
        self.length += len(tokens)
        return self.out[:len(tokens)]

    def rewind_to(self, n):
        assert 0 <= n <= self.length
        self.length = n


GREEDY = SamplingConfig()


def run(dec, ids, cfg=GREEDY, gamma=None, max_new=30, stop=frozenset(), seed=0, threshold=0.0, rule="coupled",
        hybrid=False, qcfg=None, guesser=None):
    dec.set_context(np.asarray(ids, dtype=np.int64))
    policy = None if gamma is None else DraftPolicy(dec.max_gamma, fixed=gamma)
    lookup_policy = DraftPolicy(dec.max_gamma, fixed=gamma, free_drafts=True) if hybrid else None
    sampler = Noise(seed, V) if rule == "coupled" else Rejection(np.random.default_rng(seed))
    steps = list(decode(dec, cfg, policy, sampler, max_new, stop, threshold, lookup_policy, qcfg, guesser=guesser))
    return [t for s in steps for t in s.tokens], steps


def check_kv_invariant(dec, *models):
    for m in models:
        assert m.length <= dec.n - 1
        assert m.history[:m.length] == [int(t) for t in dec.tok[:m.length]]


def test_greedy_speculative_equals_greedy_ar():
    prompt = [1, 5, 7]
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), prompt)
    for noise in (0.0, 0.3, 1.0, 5.0):
        target, drafter = FakeModel(table_logits(0)), FakeModel(table_logits(1, noise))
        dec = Decoder(target, drafter, max_gamma=4)
        sd, steps = run(dec, prompt, gamma=4)
        assert sd == ar, noise
        check_kv_invariant(dec, target, drafter)
        assert len(steps) < len(ar) or noise > 0


def test_all_accepted_drafter_catches_up_in_one_pass():
    # drafter == target: every draft is accepted, so after each step the drafter has not seen the
    # last draft; the next drafting pass must feed [last draft, bonus] together.
    target, drafter = FakeModel(table_logits(0)), FakeModel(table_logits(0))
    dec = Decoder(target, drafter, max_gamma=3)
    out, steps = run(dec, [2, 3], gamma=3, max_new=12)
    assert all(s.accepted == 3 and s.from_drafter == [True, True, True, False] for s in steps)
    assert [len(p) for p in drafter.passes[:5]] == [2, 1, 1, 2, 1]  # prompt; d1; d2; [d3, bonus]; ...
    assert drafter.passes[3] == out[2:4]
    assert len(target.passes) == 3  # 12 tokens in 3 verify passes
    check_kv_invariant(dec, target, drafter)
    # and the drafter's KV history equals the committed tokens it has been fed
    assert drafter.history[:drafter.length] == [int(t) for t in dec.tok[:drafter.length]]


def test_rejection_rewinds_both_caches():
    target, drafter = FakeModel(table_logits(0)), FakeModel(table_logits(3, 3.0))
    dec = Decoder(target, drafter, max_gamma=4)
    _, steps = run(dec, [4, 4, 1], gamma=4, max_new=40)
    assert any(s.accepted < s.gamma for s in steps)
    check_kv_invariant(dec, target, drafter)


def test_trimmed_drafter_vocabulary_greedy_lossless():
    id_map = np.array([0, 2, 3, 5, 7, 8, 11], dtype=np.int64)
    target = FakeModel(table_logits(0))
    drafter = FakeModel(table_logits(0), id_map=id_map)
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), [1, 2])
    dec = Decoder(target, drafter, id_map=id_map, max_gamma=3)
    sd, steps = run(dec, [1, 2], gamma=3)
    assert sd == ar
    assert all(set(t for t, f in zip(s.tokens, s.from_drafter) if f) <= set(id_map.tolist()) for s in steps)
    check_kv_invariant(dec, target, drafter)


def test_stop_token_and_length_cut_a_step():
    target, drafter = FakeModel(table_logits(0)), FakeModel(table_logits(0))
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), [1, 2], max_new=30)
    stop = ar[5]
    dec = Decoder(target, drafter, max_gamma=4)
    out, steps = run(dec, [1, 2], gamma=4, stop=frozenset({stop}))
    assert out == ar[:ar.index(stop) + 1] and steps[-1].finish == "stop_token"
    check_kv_invariant(dec, target, drafter)
    out, steps = run(Decoder(FakeModel(table_logits(0)), FakeModel(table_logits(0)), max_gamma=4),
                     [1, 2], gamma=4, max_new=7)
    assert out == ar[:7] and steps[-1].finish == "length"


def test_context_full_is_a_finish_reason_not_a_crash():
    dec = Decoder(FakeModel(table_logits(0), capacity=16), FakeModel(table_logits(0), capacity=16), max_gamma=4)
    out, steps = run(dec, [1, 2, 3], gamma=4, max_new=100)
    assert steps[-1].finish == "context_full"
    assert dec.n == 17 and len(out) == 14


def test_interrupted_stream_leaves_consistent_kv():
    target, drafter = FakeModel(table_logits(0)), FakeModel(table_logits(2, 1.0))
    dec = Decoder(target, drafter, max_gamma=4)
    dec.set_context(np.array([1, 2, 3]))
    gen = decode(dec, SamplingConfig(), DraftPolicy(4, fixed=4), Noise(0, V), 50, frozenset())
    next(gen)
    next(gen)
    gen.close()
    check_kv_invariant(dec, target, drafter)
    # the next call continues from exactly the committed text
    committed = [int(t) for t in dec.tok[:dec.n]]
    more, _ = run(dec, committed, gamma=4, max_new=5)
    ref, _ = run(Decoder(FakeModel(table_logits(0)), None), committed, max_new=5)
    assert more == ref


def test_set_context_reuses_longest_common_prefix():
    target = FakeModel(table_logits(0))
    dec = Decoder(target, None)
    run(dec, [1, 2, 3, 4, 5], max_new=3)
    passes = len(target.passes)
    assert dec.set_context(np.array([1, 2, 3, 9, 9])) == 3
    assert target.length == 3
    run(dec, [1, 2, 3, 9, 9], max_new=1)
    assert target.passes[passes] == [9, 9]  # only the new tokens are prefilled


def test_prompt_lookup_drafts_and_losslessness():
    toks = np.array([5, 6, 7, 8, 1, 5, 6, 7, 0, 0], dtype=np.int64)
    assert lookup_draft(toks, 8, 3).tolist() == [8, 1, 5]  # after "5 6 7" came "8 1 5"
    assert lookup_draft(toks, 2, 3).tolist() == []
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), prompt)
    sd, steps = run(Decoder(FakeModel(table_logits(0)), None, lookup=True, max_gamma=4), prompt, gamma=4)
    assert sd == ar and any(s.gamma > 0 for s in steps)


def test_hybrid_drafting_lookup_first_then_drafter_lossless():
    """Drafter model + prompt lookup: lookup drafts whenever the context repeats a 2-gram, the drafter
    otherwise (catching up on what lookup steps committed in one pass); greedy output equals AR."""
    prompt = [3, 4, 5, 9, 3, 4, 5, 9, 3, 4]
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), prompt, max_new=40)
    for noise in (0.0, 1.0, 5.0):
        target, drafter = FakeModel(table_logits(0)), FakeModel(table_logits(1, noise))
        dec = Decoder(target, drafter, lookup=True, max_gamma=4)
        sd, steps = run(dec, prompt, gamma=4, max_new=40, hybrid=True)
        assert sd == ar, noise
        check_kv_invariant(dec, target, drafter)
        assert steps[0].lookup and steps[0].gamma == 4  # "3 4" occurred before: lookup drafts "5 9 3 4"
        assert any(s.gamma and not s.lookup for s in steps)  # and the drafter drafts where nothing repeats
    # a 1-token match is not enough next to a drafter; alone (the lookup rung), it is
    toks = np.array([7, 1, 2, 7], dtype=np.int64)
    dec = Decoder(FakeModel(table_logits(0)), FakeModel(table_logits(0)), lookup=True, max_gamma=3)
    dec.tok[:4] = toks
    dec.n = 4
    assert dec.draft_lookup(3) == 0 and not Decoder(FakeModel(table_logits(0)), None).lookup_ngram_min > 1
    solo = Decoder(FakeModel(table_logits(0)), None, lookup=True, max_gamma=3)
    solo.tok[:4], solo.n = toks, 4
    assert solo.draft_lookup(3) == 3 and solo.drafts[:3].tolist() == [1, 2, 7]


class Clock:
    """A fake ``time`` module for the loop: model passes advance it by their modelled cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class ScriptModel(FakeModel):
    """Says ``script[i]`` after i tokens, whatever they were (so repeated n-grams do not predict it), and
    advances a :class:`Clock` by a modelled pass cost."""

    def __init__(self, script, clock, first, per_row, **kw):
        super().__init__(table_logits(0), **kw)
        self.script, self.clock, self.first, self.per_row = script, clock, first, per_row

    def forward(self, tokens):
        self.clock.now += self.first + self.per_row * (len(tokens) - 1)
        super().forward(tokens)
        out = self.out[:len(tokens)]
        out[:] = 0.0
        for i in range(len(tokens)):
            out[i, self.script[self.length - len(tokens) + i + 1]] = 10.0
        return out


def test_hybrid_policies_turn_useless_lookup_off_and_keep_the_drafter(monkeypatch):
    """Lookup drafts that are nearly always rejected: its policy stops proposing them (only probes, with
    back-off), while the drafter's policy, judged on its own steps, keeps speculating with its good drafts."""
    import edge_spec.runtime.speculative as spec

    clock = Clock()
    monkeypatch.setattr(spec, "time", clock)
    script = np.random.default_rng(3).integers(0, V, size=300).tolist()  # repeated 2-grams, random sequels
    target = ScriptModel(script, clock, 0.010, 0.0025, capacity=300)
    drafter = ScriptModel(script, clock, 0.0005, 0.0, capacity=300)  # always right
    dec = Decoder(target, drafter, lookup=True, max_gamma=4)
    dec.set_context(np.asarray(script[:20], dtype=np.int64))
    lookup_policy, policy = DraftPolicy(4, free_drafts=True, probe_every=4), DraftPolicy(4, probe_every=4)
    steps = list(decode(dec, GREEDY, policy, Noise(0, V), 200, frozenset(), 0.0, lookup_policy))
    assert [t for s in steps for t in s.tokens] == script[20:220]
    lookup = [s for s in steps if s.lookup]
    assert lookup and sum(s.accepted for s in lookup) < 0.3 * sum(s.gamma for s in lookup)
    assert len(lookup) <= 8  # probes with growing gaps, not every step with a match
    assert sum(s.accepted for s in steps if not s.lookup) >= 120  # the drafter carried the speculation
    check_kv_invariant(dec, target, drafter)


def test_policy_turns_speculation_off_when_slower_and_reprobes_with_backoff():
    pol = DraftPolicy(6, probe_every=5)
    seen = []
    for _ in range(400):  # a cheap drafter whose drafts are never accepted
        seen.append(pol.next_gamma())
        pol.update(seen[-1], 0, 0.001 * seen[-1], 0.01 * (1 + 0.25 * seen[-1]), drafter_passes=seen[-1])
    probes = [i for i, g in enumerate(seen) if g and (i == 0 or not seen[i - 1])]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert seen.count(0) >= 380 and len(gaps) >= 3
    assert all(b >= 2 * a - 2 for a, b in zip(gaps[1:], gaps[2:])) and gaps[-1] > 100  # each wait ~2x the last
    slow = DraftPolicy(6)  # a drafter as slow as the target can never pay: after measuring, no more probes
    seen = []
    for _ in range(200):
        seen.append(slow.next_gamma())
        slow.update(seen[-1], 0, 0.01 * seen[-1], 0.01 * (1 + 0.25 * seen[-1]), drafter_passes=seen[-1])
    assert sum(1 for g in seen[20:] if g) == 0
    fast = DraftPolicy(6)
    for _ in range(30):  # cheap drafter, everything accepted
        g = fast.next_gamma()
        fast.update(g, g, 0.0005 * g, 0.01 * (1 + 0.1 * g), drafter_passes=g)
    assert fast.next_gamma() >= 4
    assert DraftPolicy(6, fixed=3).next_gamma() == 3


def test_policy_probes_small_then_grows_when_drafts_are_good():
    """A probe drafts one token twice (the first step only catches the drafter up), then the
    goodput model lengthens drafts that are accepted."""
    pol = DraftPolicy(8)
    seen = []
    for _ in range(30):
        seen.append(pol.next_gamma())
        g = seen[-1]
        pol.update(g, g, 0.001 * g, 0.01 * (1 + 0.1 * g), drafter_passes=g, timed=len(seen) > 1)
    assert seen[:4] == [0, 0, 1, 1]  # prefill, one measured AR step, then the probe
    assert seen[-1] >= 6
    assert pol.t_verify[2] is not None


def _settle(pol: DraftPolicy, accept_at: list[float], steps: int = 1500) -> float:
    """Tokens per second of ``pol`` against a drafter whose d-th draft (given the earlier ones right) is accepted
    with probability ``accept_at[d - 1]`` (seeded); drafts cost 6 % of a target step, a verify 3 % more per token."""
    rng = np.random.default_rng(0)
    tokens, seconds = 0, 0.0
    for i in range(steps):
        g = pol.next_gamma()
        m = 0
        while m < g and rng.random() < accept_at[min(m, len(accept_at) - 1)]:
            m += 1
        t_d, t_v = 0.0006 * g, 0.01 * (1 + 0.03 * g)
        pol.update(g, m, t_d, t_v, drafter_passes=g, timed=i > 0)
        if i >= 200:
            tokens, seconds = tokens + m + 1, seconds + t_d + t_v
    return tokens / seconds


def _best_fixed(accept_at: list[float], max_gamma: int = 6) -> float:
    """Expected tokens per second of the best fixed draft length under :func:`_settle`'s costs."""
    best, expected, power = 100.0, 1.0, 1.0
    for g in range(1, max_gamma + 1):
        power *= accept_at[min(g - 1, len(accept_at) - 1)]
        expected += power
        best = max(best, expected / (0.0006 * g + 0.01 * (1 + 0.03 * g)))
    return best


@pytest.mark.parametrize("accept_at", [[0.9, 0.05], [0.5, 0.95], [0.52, 0.44, 0.40, 0.28], [0.6]])
def test_policy_learns_acceptance_per_depth(accept_at):
    """Acceptance is learnt per draft depth (a feature drafter's falls with depth, a layer drafter's rises): the
    adaptive policy comes within 6 % of the best fixed draft length for the drafter, which it does not know."""
    pol = DraftPolicy(6)
    assert _settle(pol, accept_at) >= 0.94 * _best_fixed(accept_at)
    if accept_at[0] > 0.8:
        assert pol.accept[1] > 0.7 and pol.accept[2] < 0.3


def _useless_drafter_cost(verify_slope: float, c: float, tokens: int) -> float:
    """Time of ``tokens`` tokens under the policy with drafts never accepted, over plain decoding's."""
    pol = DraftPolicy(8)
    total, made, first = 0.0, 0, True
    while made < tokens:
        g = pol.next_gamma()
        t_d, t_v = c * g, 1.0 + verify_slope * g
        total += t_d + t_v
        pol.update(g, 0, t_d, t_v, drafter_passes=g, timed=not first)
        first = False
        made += 1
    return total / tokens


@pytest.mark.parametrize("slope", [0.15, 0.5, 1.6])
@pytest.mark.parametrize("tokens", [128, 1000])
def test_policy_loses_at_most_5_percent_with_a_useless_drafter(slope, tokens):
    """Probes are short and back off exponentially (slope: verify cost per extra token, in AR steps;
    0.15 ~ int8 activations, 1.6 ~ fp32 activations on SmolLM2 — GUIDE §3)."""
    assert _useless_drafter_cost(slope, 0.15, tokens) <= 1.05


def test_policy_keeps_a_weak_drafter_that_pays_under_timing_noise():
    """A drafter accepted 0.3 of the time whose draft costs 0.08 of a step and whose 2-row verify 1.03 steps pays
    1.3 / 1.11 = 1.171x at gamma 1. Step times jitter 10 % as on a real machine and rejections come in runs: the
    policy must not read either as "speculation does not pay" for long (with 0.15 averages it kept speculation off
    a third of the time or more: 0.94 of gamma 1's speed over these seeds; now 0.98)."""
    speeds = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        pol, prev, tokens, seconds = DraftPolicy(6), 0, 0, 0.0
        for i in range(3000):
            g = pol.next_gamma()
            m = 0
            while m < g and rng.random() < 0.3:
                m += 1
            t_v = 0.01 * (1 + 0.03 * g)
            # as in the loop: the first drafting step after plain ones catches the drafter up and is not timed
            pol.update(g, m, 0.0008 * g, t_v * float(np.exp(rng.normal(0.0, 0.1))), drafter_passes=g,
                       timed=i > 0 and not (g and not prev))
            prev = g
            if i >= 200:
                tokens, seconds = tokens + m + 1, seconds + t_v + 0.0008 * g
        speeds.append(tokens / seconds / 100)
    assert np.mean(speeds) >= 0.96 * 1.3 / 1.11


def test_policy_keeps_a_confident_drafter_that_often_declines_to_draft():
    """Steps where the confidence threshold stops the drafter before its first token are not rejections."""
    pol = DraftPolicy(6)
    for i in range(40):
        g = pol.next_gamma()
        if i % 2:  # the drafter was not confident: one cheap pass, nothing drafted
            pol.update(0, 0, 0.0005, 0.01, drafter_passes=1)
        else:  # confident drafts, all accepted
            pol.update(g, g, 0.0005 * g, 0.01 * (1 + 0.1 * g), drafter_passes=g)
    assert pol.next_gamma() >= 4


def test_policy_switches_off_when_realised_goodput_is_below_ar():
    """The drafter almost never drafts, so each step is AR plus a wasted drafter pass: go AR."""
    pol = DraftPolicy(6)
    pol.update(0, 0, 0.0, 0.01, drafter_passes=0)  # one measured AR step
    for _ in range(10):
        pol.update(0, 0, 0.004, 0.01, drafter_passes=1)
    assert pol.next_gamma() == 0


def test_an_unlucky_probe_step_does_not_veto_a_drafter_that_pays():
    """A probe's first step is not timed (the drafter catches up on the steps it skipped), so earlier probes left
    one timed step each — here four where the drafter declined. The realised-goodput check judges the current run
    only: a probe whose catch-up step was accepted and whose timed step declined keeps drafting (it used to be
    vetoed by the old record, turning a drafter accepted 0.54 of the time off on most steps)."""
    pol = DraftPolicy(6, probe_every=4)
    pol.update(0, 0, 0.0, 0.01)  # one measured AR step
    for _ in range(4):  # an old record: speculative steps of one token each
        pol.update(0, 0, 0.0005, 0.01, drafter_passes=1)
    assert pol.next_gamma() == 0
    while pol.next_gamma() == 0:  # plain steps until the next probe
        pol.update(0, 0, 0.0, 0.01)
    pol.update(1, 1, 0.004, 0.02, drafter_passes=1, timed=False)  # catch-up step: accepted, not timed
    pol.update(0, 0, 0.0005, 0.01, drafter_passes=1)  # timed: the drafter declined
    assert pol.next_gamma() >= 1
    off = []
    for _ in range(5):  # but a current run that does not pay still turns speculation off after four timed steps
        pol.update(0, 0, 0.004, 0.01, drafter_passes=1)
        off.append(pol.next_gamma() == 0)
    assert off[:2] == [False, False] and off[3]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampled_first_token_matches_target_distribution(temperature):
    """End-to-end through the loop with fakes: the first generated token is distributed as p."""
    from scipy.stats import chisquare

    from edge_spec.runtime.sampling import probs

    cfg = SamplingConfig(temperature, 0, 0.9)
    table_t, table_d = table_logits(0), table_logits(5, 1.5)
    p = probs(table_t[2, 3][None], cfg)[0]
    counts = np.zeros(V)
    for seed in range(1500):
        dec = Decoder(FakeModel(table_t), FakeModel(table_d), max_gamma=3)
        out, _ = run(dec, [2, 3], cfg, gamma=3, max_new=1, seed=seed)
        counts[out[0]] += 1
    keep = p * 1500 >= 5
    assert counts[~keep].sum() <= max(5, 3 * p[~keep].sum() * 1500)
    exp = np.append(p[keep], p[~keep].sum()) * 1500
    obs = np.append(counts[keep], counts[~keep].sum())
    assert chisquare(obs[exp > 0], exp[exp > 0]).pvalue > 1e-3


class RandomGammaPolicy(DraftPolicy):
    """A draft-length policy that picks gamma at random each step, like timing noise does to the adaptive one."""

    def __init__(self, max_gamma: int, seed: int) -> None:
        super().__init__(max_gamma, fixed=max_gamma)
        self.rng = np.random.default_rng(seed)

    def next_gamma(self) -> int:
        return int(self.rng.integers(0, self.max_gamma + 1))


@pytest.mark.parametrize("trimmed, draft_t", [(False, None), (True, None), (False, 0.0), (True, 0.9), (False, 0.3)])
def test_sampled_output_is_the_same_for_any_draft_lengths(trimmed, draft_t):
    """Same seed -> same sampled tokens whatever gamma each step uses, and the same as plain AR sampling, for any
    draft temperature (None: the default, sharper than the target's; 0: argmax drafts; 0.9: the target's)."""
    cfg = SamplingConfig(0.9, 0, 0.95)
    qcfg = draft_sampling(cfg, draft_t)
    id_map = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11]) if trimmed else None
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), [2, 3], cfg, max_new=40, seed=9)
    outs, accepted = set(), 0
    for policy_seed in range(6):
        dec = Decoder(FakeModel(table_logits(0)), FakeModel(table_logits(5, 0.5), id_map=id_map), max_gamma=5,
                      id_map=id_map)
        dec.set_context(np.array([2, 3]))
        steps = list(decode(dec, cfg, RandomGammaPolicy(5, policy_seed), Noise(9, V), 40, frozenset(), qcfg=qcfg))
        outs.add(tuple(t for s in steps for t in s.tokens))
        accepted += sum(s.accepted for s in steps)
    assert outs == {tuple(ar)}
    assert accepted > 40  # drafts really were accepted along the way
    other, _ = run(Decoder(FakeModel(table_logits(0)), None), [2, 3], cfg, max_new=40, seed=10)
    assert other != ar  # the seed matters


@pytest.mark.parametrize("mode, draft_t", [("model", None), ("lookup", None), ("hybrid", None), ("model", 0.0),
                                           ("model", 0.4), ("model", 1.0)])
def test_unseeded_rejection_rule_is_distributed_as_p_over_two_tokens(mode, draft_t):
    """The rejection rule (unseeded calls): the first two generated tokens jointly follow p, through
    accepted drafts, rejections with residual sampling, and bonus tokens (model, lookup or hybrid drafts), whatever
    the drafts' temperature (None: the default 0.7x; 0: argmax drafts, q one-hot; 1.0: the target's)."""

    from edge_spec.runtime.sampling import probs

    cfg = SamplingConfig(1.0)
    table_t, table_d = table_logits(0), table_logits(5, 1.5)
    # lookup drafts "3 ..." after the repeated 2; hybrid drafts "1 2 3" after the repeated 2-gram "2 3"
    prompt = [2, 3, 1, 2, 3] if mode == "hybrid" else [2, 3, 2]
    last, prev = prompt[-1], prompt[-2]
    p1 = probs(table_t[prev, last][None], cfg)[0]
    joint = np.zeros((V, V))
    for a in range(V):
        joint[a] = p1[a] * probs(table_t[last, a][None], cfg)[0]
    n = 4000
    counts = np.zeros((V, V))
    lookups = 0
    for seed in range(n):
        drafter = None if mode == "lookup" else FakeModel(table_d)
        dec = Decoder(FakeModel(table_t), drafter, lookup=mode != "model", max_gamma=3)
        out, steps = run(dec, prompt, cfg, gamma=3, max_new=2, seed=seed, rule="rejection", hybrid=mode == "hybrid",
                         qcfg=draft_sampling(cfg, draft_t))
        lookups += sum(s.lookup for s in steps)
        counts[out[0], out[1]] += 1
    assert (lookups > 0) == (mode != "model")
    assert_follows(counts, joint)


def assert_follows(counts: np.ndarray, p: np.ndarray) -> None:
    """Chi-square of observed ``counts`` against the probabilities ``p`` (same shape); cells expected below 5
    are pooled into one (and must stay rare), so sparse distributions still give a valid test."""
    from scipy.stats import chisquare

    n = counts.sum()
    exp, obs = p.ravel() * n, counts.ravel()
    keep = exp >= 5
    assert obs[~keep].sum() <= max(10, 3 * exp[~keep].sum())
    e = np.append(exp[keep], exp[~keep].sum())
    o = np.append(obs[keep], obs[~keep].sum())
    assert chisquare(o, e * o.sum() / e.sum()).pvalue > 1e-3


def test_rejection_rule_accepts_at_least_as_many_drafts_as_the_coupling():
    cfg = SamplingConfig(1.0)
    acc = {}
    for rule in ("coupled", "rejection"):
        drafted = accepted = 0
        for seed in range(300):
            dec = Decoder(FakeModel(table_logits(0)), FakeModel(table_logits(5, 1.5)), max_gamma=3)
            _, steps = run(dec, [2, 3], cfg, gamma=3, max_new=12, seed=seed, rule=rule)
            drafted += sum(s.gamma for s in steps)
            accepted += sum(s.accepted for s in steps)
        acc[rule] = accepted / drafted
    assert acc["rejection"] > acc["coupled"], acc


def test_min_p_keeps_tokens_within_a_factor_of_the_likeliest():
    from edge_spec.runtime.sampling import probs

    logits = np.log(np.array([[0.5, 0.3, 0.1, 0.06, 0.04]]))
    p = probs(logits, SamplingConfig(1.0, 0, 1.0, 0.15))[0]  # keep p >= 0.075: the first three
    np.testing.assert_allclose(p, [0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0, 0], rtol=1e-9)
    with pytest.raises(Exception, match="min_p=1.5 must be a number in"):
        SamplingConfig(1.0, 0, 1.0, 1.5)


@pytest.mark.parametrize("rule, draft_t", [("coupled", None), ("rejection", None), ("coupled", 0.0),
                                           ("rejection", 0.0)])
def test_min_p_speculative_sampling_follows_p(rule, draft_t):
    """With min-p (and the other filters) drafts are judged against the same transformed p: chi-square on the first
    token, seeded (coupled race) and unseeded (rejection rule)."""
    from scipy.stats import chisquare

    from edge_spec.runtime.sampling import probs

    cfg = SamplingConfig(0.9, 8, 0.97, 0.05)
    table_t, table_d = table_logits(0), table_logits(5, 1.5)
    p = probs(table_t[2, 3][None], cfg)[0]
    n = 2000
    counts = np.zeros(V)
    drafted = 0
    for seed in range(n):
        dec = Decoder(FakeModel(table_t), FakeModel(table_d), max_gamma=3)
        out, steps = run(dec, [2, 3], cfg, gamma=3, max_new=4, seed=seed, rule=rule,
                         qcfg=draft_sampling(cfg, draft_t))
        counts[out[0]] += 1
        drafted += steps[0].gamma
    assert drafted == 3 * n  # the first token always came out of a verify of 3 drafts
    assert counts[p == 0].sum() == 0  # min-p / top-k / top-p removed tokens never appear
    keep = p > 0
    assert chisquare(counts[keep], p[keep] * n).pvalue > 1e-3


def test_draft_temperature_defaults_to_a_fraction_of_the_targets_and_is_checked():
    from edge_spec.errors import EdgeSpecError
    from edge_spec.runtime.config import GenerationConfig
    from edge_spec.runtime.sampling import DRAFT_TEMPERATURE_RATIO

    cfg = GenerationConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    assert cfg.draft_sampling == SamplingConfig(0.8 * DRAFT_TEMPERATURE_RATIO, 40, 0.95, 0.05)
    assert GenerationConfig(temperature=0.8, draft_temperature=0).draft_sampling.greedy
    assert GenerationConfig(draft_temperature=0.5).draft_sampling.greedy  # a greedy target drafts greedily
    for bad in (-0.1, "warm", float("nan"), float("inf"), True):
        with pytest.raises(EdgeSpecError, match="draft_temperature=.* must be None"):
            GenerationConfig(temperature=0.8, draft_temperature=bad)


def test_confidence_gate_reads_the_drafter_at_the_targets_temperature():
    """Drafts drawn sharper than the target's temperature do not make the drafter look surer: the gate compares its
    top probability at the target's temperature (before filters) with the threshold, whatever draft temperature."""
    logits = np.zeros((V, V, V))
    logits[..., 4] = 1.0  # drafter's favourite token: probability e / (e + V - 1) at T = 1, ~1 at T = 0.1
    top = np.e / (np.e + V - 1)
    cfg = SamplingConfig(1.0)
    for draft_t, threshold, drafts in ((1.0, top - 0.01, True), (1.0, top + 0.01, False), (0.1, top + 0.01, False),
                                       (0.0, top + 0.01, False), (0.0, top - 0.01, True)):
        dec = Decoder(FakeModel(table_logits(0)), FakeModel(logits), max_gamma=2)
        _, steps = run(dec, [2, 3], cfg, gamma=2, max_new=3, threshold=threshold, qcfg=draft_sampling(cfg, draft_t))
        assert (steps[0].gamma > 0) == drafts, (draft_t, threshold)
