"""The draft-verify loop with a feature drafter (EAGLE-3 style) behind the backend seam, on scripted fakes.

The fake target writes, at every position p it processes, a feature row encoding its token x_p; the fake
drafter's row p reads (feature x_p, token x_{p+1}) and predicts x_{p+2} from a noisy copy of the target's
table, and its own output encodes x_{p+1}, so a draft step that reads it predicts exactly as a feature row
would. Every guarantee of the token-drafter loop must hold: greedy SD == AR, the KV invariant (the drafter
keeps only rows it read from committed target features), same seed -> same text for any draft lengths, and
the unseeded rejection rule distributed as p (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
from test_runtime_loop import GREEDY, FakeModel, RandomGammaPolicy, V, assert_follows, run, table_logits

from edge_spec.runtime.drafting import DraftPolicy
from edge_spec.runtime.sampling import Noise, SamplingConfig, probs
from edge_spec.runtime.speculative import Decoder, decode


class FeatureTarget(FakeModel):
    """A fake target that also writes ``features`` [capacity + max_rows, V] float16: one-hot of x_p at row p."""

    def __init__(self, table: np.ndarray, **kw) -> None:
        super().__init__(table, **kw)
        self.features = np.zeros((self.capacity + self.max_rows, V), dtype=np.float16)

    def forward(self, tokens):
        start = self.length
        out = super().forward(tokens)
        self.features[start:start + len(tokens)] = 0
        for i, t in enumerate(tokens):
            self.features[start + i, int(t)] = 1
        return out


class FeatureDrafter:
    """Row p: (features at p or its own last output, token x_{p+1}) -> logits of x_{p+2}; records what each
    KV row read (``rows[p]`` = (x_p it saw, x_{p+1}, "target" | "own"))."""

    reads_features = True

    def __init__(self, table: np.ndarray, capacity: int = 64, max_rows: int = 8,
                 id_map: np.ndarray | None = None) -> None:
        self.table, self.capacity, self.max_rows, self.id_map = table, capacity, max_rows, id_map
        self.vocab_size = V if id_map is None else len(id_map)
        self.length = 0
        self.rows: list[tuple[int, int, str]] = []
        self.hidden = 0  # the token its last output encodes
        self.out = np.zeros((max_rows, self.vocab_size))

    def forward(self, tokens, features=None):
        tokens = [int(t) for t in tokens]
        assert 0 < len(tokens) <= self.max_rows and self.length + len(tokens) <= self.capacity
        del self.rows[self.length:]
        if features is None:
            assert len(tokens) == 1
            seen = [self.hidden]
        else:
            assert features.dtype == np.float16 and features.shape == (len(tokens), V)
            seen = [int(f.argmax()) for f in features]
        for i, (x, t) in enumerate(zip(seen, tokens)):
            self.rows.append((x, t, "own" if features is None else "target"))
            row = self.table[x, t]
            self.out[i] = row if self.id_map is None else row[self.id_map]
        self.hidden = tokens[-1]
        self.length += len(tokens)
        return self.out[:len(tokens)]

    def rewind_to(self, n):
        assert 0 <= n <= self.length
        self.length = n


def check_feature_invariant(dec: Decoder, drafter: FeatureDrafter) -> None:
    """Between steps the drafter holds only rows read from the target's features at committed positions."""
    assert drafter.length <= dec.target.length <= dec.n - 1
    for p, (x, t, kind) in enumerate(drafter.rows[:drafter.length]):
        assert kind == "target" and (x, t) == (dec.tok[p], dec.tok[p + 1]), p


def pair(noise: float, seed: int = 1, id_map: np.ndarray | None = None) -> tuple[FeatureTarget, FeatureDrafter]:
    return FeatureTarget(table_logits(0)), FeatureDrafter(table_logits(seed, noise), id_map=id_map)


def test_greedy_feature_drafting_equals_greedy_ar_and_keeps_only_committed_features():
    prompt = [1, 5, 7]
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), prompt)
    for noise in (0.0, 0.3, 1.0, 5.0):
        target, drafter = pair(noise)
        dec = Decoder(target, drafter, max_gamma=4)
        dec.set_context(np.asarray(prompt))
        steps = []
        for step in decode(dec, GREEDY, DraftPolicy(4, fixed=4), Noise(0, V), 30, frozenset()):
            steps.append(step)
            check_feature_invariant(dec, drafter)
        assert [t for s in steps for t in s.tokens] == ar, noise
        if noise == 0.0:  # a perfect feature drafter: every draft accepted
            assert all(s.accepted == s.gamma for s in steps[:-1]) and len(steps) <= len(ar) // 5 + 2


def test_feature_drafter_rows_are_what_each_committed_position_read():
    target, drafter = pair(0.0)
    dec = Decoder(target, drafter, max_gamma=3)
    out, steps = run(dec, [2, 3, 4, 5], gamma=3, max_new=12)
    # the first draft() prefilled the target on the prompt minus its last token, then the drafter read rows 0..2
    assert target.passes[0] == [2, 3, 4]
    assert steps[0].gamma == 3
    check_feature_invariant(dec, drafter)


def test_one_token_context_drafts_nothing_then_speculates():
    target, drafter = pair(0.0)
    dec = Decoder(target, drafter, max_gamma=3)
    out, steps = run(dec, [4], gamma=3, max_new=10)
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), [4], max_new=10)
    assert out == ar and steps[0].gamma == 0 and steps[1].gamma == 3


def test_trimmed_feature_drafter_and_hybrid_lookup_are_lossless():
    id_map = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11])
    prompt = [2, 3, 1, 2, 3, 4, 2, 3]
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), prompt, max_new=40)
    for hybrid in (False, True):
        target, drafter = pair(0.5, id_map=id_map)
        dec = Decoder(target, drafter, lookup=hybrid, max_gamma=4, id_map=id_map)
        out, steps = run(dec, prompt, gamma=4, max_new=40, hybrid=hybrid)
        assert out == ar
        check_feature_invariant(dec, drafter)
        assert any(s.lookup for s in steps) == hybrid


def test_sampled_feature_drafting_is_the_same_for_any_draft_lengths():
    cfg = SamplingConfig(0.9, 0, 0.95)
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), [2, 3], cfg, max_new=40, seed=9)
    outs, accepted = set(), 0
    for policy_seed in range(6):
        target, drafter = pair(0.5, seed=5)
        dec = Decoder(target, drafter, max_gamma=5)
        dec.set_context(np.array([2, 3]))
        steps = list(decode(dec, cfg, RandomGammaPolicy(5, policy_seed), Noise(9, V), 40, frozenset()))
        outs.add(tuple(t for s in steps for t in s.tokens))
        accepted += sum(s.accepted for s in steps)
        check_feature_invariant(dec, drafter)
    assert outs == {tuple(ar)}
    assert accepted > 40


@pytest.mark.parametrize("hybrid", [False, True])
def test_unseeded_feature_drafting_is_distributed_as_p_over_two_tokens(hybrid):
    """Chi-square over the joint of the first two tokens (rejection rule, residual sampling, bonus tokens)."""
    cfg = SamplingConfig(1.0)
    prompt = [2, 3, 1, 2, 3] if hybrid else [2, 3, 2]
    last, prev = prompt[-1], prompt[-2]
    table_t = table_logits(0)
    p1 = probs(table_t[prev, last][None], cfg)[0]
    joint = np.array([p1[a] * probs(table_t[last, a][None], cfg)[0] for a in range(V)])
    n = 4000
    counts = np.zeros((V, V))
    accepted = 0
    for seed in range(n):
        target, drafter = pair(1.5, seed=5)
        dec = Decoder(target, drafter, lookup=hybrid, max_gamma=3)
        out, steps = run(dec, prompt, cfg, gamma=3, max_new=2, seed=seed, rule="rejection", hybrid=hybrid)
        accepted += sum(s.accepted for s in steps if s.lookup == hybrid)
        counts[out[0], out[1]] += 1
    assert accepted > (50 if hybrid else n // 4)  # the drafter's (hybrid: lookup's) drafts really were accepted
    assert_follows(counts, joint)
