"""Drafts without a model (the degradation ladder's middle rung) and the draft-length policy.

* :func:`lookup_draft` — prompt lookup (CopySpec / prompt-lookup decoding): find the latest
  earlier occurrence of the context's last n-gram (prompt and output so far) and propose what
  followed it. Alone it is the ladder's middle rung; next to a drafter model it drafts first
  whenever the context has a match (hybrid drafting, :func:`edge_spec.runtime.speculative.decode`).
* :class:`DraftPolicy` — how many tokens to draft next: fixed, or chosen online to maximise
  goodput (SmartSpec-style) from measured drafter/target step costs and acceptance, including
  gamma = 0 (speculation off) with re-probing that backs off exponentially.
"""

from __future__ import annotations

import numpy as np


def lookup_draft(tokens: np.ndarray, n: int, max_len: int, ngram_max: int = 3, ngram_min: int = 1) -> np.ndarray:
    """Continuation of the most recent earlier match of the last ``k`` tokens (k = ngram_max..ngram_min).

    ``tokens[:n]`` is the context. Returns a view of at most ``max_len`` tokens (maybe empty).
    """
    if max_len <= 0 or n < 2:
        return tokens[:0]
    for k in range(min(ngram_max, n - 1), max(ngram_min, 1) - 1, -1):
        tail = tokens[n - k:n]
        hits = tokens[:n - k] == tail[0]  # transient bool array: freed at once, not kept per token
        for j in range(1, k):
            hits &= tokens[j:n - k + j] == tail[j]
        idx = np.flatnonzero(hits)
        if len(idx):
            start = int(idx[-1]) + k
            return tokens[start:min(n, start + max_len)]
    return tokens[:0]


RELAX = 0.2  # how fast an untried depth's acceptance drifts back toward the depth before it (x ema)
DEEP_EMA = 0.15  # acceptance average of depths >= 2 (γ's length follows bursts of easy text)
JUDGED = 4  # timed speculative steps after which the realised goodput may switch speculation off


class DraftPolicy:
    """Chooses gamma for the next step.

    ``fixed`` set: always that gamma (bounded by the plan). Otherwise gamma maximises expected
    tokens per second, E(g) / (g * t_draft + t_verify(g + 1)) with E(g) = 1 + a_1 + a_1 a_2 + ...
    + a_1 ... a_g, against 1 / t_verify(1) for plain AR, where a_d is the acceptance of the d-th draft
    given the ones before it were accepted — learnt per depth, because it is not constant: a layer
    drafter's rises with depth, a feature drafter's falls (a depth not yet tried takes the value of
    the one before it). Costs and acceptance are exponential moving averages (``ema`` 0.08: ~12 steps; deeper
    depths' acceptance :data:`DEEP_EMA`) of what the loop measures, the first depth's acceptance a plain running
    mean over its first 1 / ema drafts (so the optimistic start value is forgotten fast). Slow on purpose: with a
    drafter accepted ~0.3 of the time whose 2-row verify costs about a 1-row step, 0.15 averages fell below
    break-even on any run of ~6 rejections or a few slow steps and kept speculation off a third of the time or
    more (``policy_sim.py --time-noise 0.1``, a probe deleted since: docs/journal/README.md). Acceptance is per
    *drafted* token, so a step where the
    confidence threshold stopped the drafter before its first token does not count as a
    rejection (that would switch off a drafter whose confident drafts are nearly always right).
    The model cannot see how often the threshold cuts drafts short, so the realised goodput of
    speculative steps (committed tokens per second, discounted sums with the same ema) is tracked too: when it
    falls below the AR rate, speculation is switched off; for a drafter model that check needs four timed
    speculative steps of the current run (since the last probe started), so one probe's unlucky step cannot veto a
    drafter that pays, and a probe counts as failed (the wait doubles) when its run is switched off before or by
    that check.

    Probes are cheap by construction, because a useless drafter must cost almost nothing (issue:
    at most 5 % below plain decoding): a probe drafts one token twice (the first step only
    catches the drafter up), then two; larger gammas are reached only through the goodput model
    once acceptance is measured. A probe that ends with speculation still off doubles the wait
    before the next one (``probe_every`` steps, then 2x, 4x, ... up to ``max_backoff``); a probe
    that switches speculation on resets it. Plain Python floats: this runs once per step and
    must cost microseconds.
    """

    def __init__(self, max_gamma: int, fixed: int | None = None, probe_every: int = 16, ema: float = 0.08,
                 free_drafts: bool = False, max_backoff: int = 1024) -> None:
        self.max_gamma = max_gamma
        self.fixed = None if fixed is None else min(fixed, max_gamma)
        self.probe_every = probe_every
        self.max_backoff = max_backoff
        self.wait = probe_every  # steps off before the next probe (doubles after each failed probe)
        self.probing = False
        self.ema = ema
        self.free_drafts = free_drafts  # prompt lookup: drafting costs ~nothing
        # a_d, d = 1..max_gamma: acceptance of the d-th draft given d - 1 accepted (index 0 unused). Optimistic
        # start: speculate first, measure, then decide.
        self.accept = [0.6] * (max_gamma + 1)
        self.tried = [False] * (max_gamma + 1)
        self.judged_first = 0  # first drafts judged so far
        self.t_draft = 0.0  # seconds per drafter pass
        self.t_verify: list[float | None] = [None] * (max_gamma + 2)  # seconds of a k-token target pass
        self.steps_since_probe = 0
        self.spec_tokens = 0.0  # committed tokens of the run's speculative steps (sum discounted by 1 - ema a step)
        self.spec_time = 0.0  # their seconds (same discount): only the ratio is used
        self.spec_steps = 0
        self.probe: list[int] = []  # gammas still to run in the current probe
        # Adaptive: start with plain steps (the first prefills the prompt and is not timed, the
        # second measures the AR cost every later decision is compared with), then probe.
        self.choice = 0 if fixed is None else self.fixed
        self.steps_since_probe = self.wait - 2

    def next_gamma(self) -> int:
        return self.choice

    def verify_cost(self, k: int) -> float:
        """Measured cost of a k-token pass, else extrapolated from the nearest measured one."""
        t = self.t_verify[k]
        if t is not None:
            return t
        for j in range(len(self.t_verify)):  # nearest measured pass, scaled by GUIDE §3's int4 slope
            for m in (k - j, k + j):
                if 0 < m < len(self.t_verify) and self.t_verify[m] is not None:
                    return self.t_verify[m] * (1 + 0.25 * (k - 1)) / (1 + 0.25 * (m - 1))
        return 1.0

    def observe(self, k: int, t_verify: float) -> None:
        """A k-token target pass measured while the other drafting source ran the step (hybrid drafting):
        only the cost table learns from it."""
        if 0 < k < len(self.t_verify):
            old = self.t_verify[k]
            self.t_verify[k] = t_verify if old is None else (1 - self.ema) * old + self.ema * t_verify

    def update(self, gamma: int, accepted: int, t_draft: float, t_verify: float, drafter_passes: int = 0,
               timed: bool = True) -> None:
        """Record one step: ``gamma`` drafted, ``accepted`` accepted, seconds spent in each model.

        ``timed=False`` (the step also prefilled a prompt or caught a model up): its times are
        not step costs, so only acceptance and the re-probe countdown are updated."""
        e = self.ema
        seen = min(accepted + 1, gamma)  # depths tried: the accepted ones and the first rejected
        for d in range(1, self.max_gamma + 1 if gamma else 1):
            if d <= seen:
                if not self.tried[d] and d > 1:  # first seen: start from what the depth before it has learnt
                    self.accept[d] = self.accept[d - 1]
                # depth 1: a running mean (the guessed start value counting once) until 1 / ema drafts; deeper
                # depths start from what the depth before them learnt, so an unlucky first draft must not sink them
                w = max(e, 1.0 / (self.judged_first + 2)) if d == 1 else DEEP_EMA
                self.accept[d] = (1 - w) * self.accept[d] + w * (1.0 if d <= accepted else 0.0)
                self.tried[d] = True
                self.judged_first += d == 1
            elif self.tried[d]:  # deeper than this step reached: drift toward the depth before it, so a low
                self.accept[d] += RELAX * e * (self.accept[d - 1] - self.accept[d])  # guess is retried
        if timed:
            self.observe(gamma + 1, t_verify)
            if drafter_passes or gamma:
                per = t_draft / max(drafter_passes, gamma)
                self.t_draft = per if self.t_draft == 0 else (1 - e) * self.t_draft + e * per
                # Goodput of speculative steps as a ratio of discounted sums (tokens / seconds): an
                # average of per-step ratios would overweight the cheap, declined steps.
                keep = 0.0 if self.spec_steps == 0 else 1 - e
                self.spec_tokens = keep * self.spec_tokens + accepted + 1
                self.spec_time = keep * self.spec_time + t_draft + t_verify
                self.spec_steps += 1
        if self.fixed is not None:
            return
        if self.probe:
            self.choice = self.probe.pop(0)
            return
        self.choice = self._best()
        if self.probing and (self.choice == 0 or self.spec_steps >= JUDGED):
            # the probe's run is judged (off, or on after enough timed steps): back off if it failed, else start over
            self.probing = False
            self.wait = min(2 * self.wait, self.max_backoff) if self.choice == 0 else self.probe_every
        if self.choice == 0:
            self.steps_since_probe += 1
            if self.steps_since_probe >= self.wait:
                self.steps_since_probe = 0
                self.choice = self._start_probe()  # acceptance or costs may have changed
        else:
            self.steps_since_probe = 0

    def _start_probe(self) -> int:
        """Queue a short speculative probe; returns its gamma (0 when no probe could pay).

        The probe drafts the smallest gamma that would beat plain decoding by 10 % if the
        drafts were good (acceptance 0.9), judged on the step costs measured so far: gamma 1
        on a fresh policy. It runs twice, because the first step after a pause is not timed
        (the drafter catches up on the tokens it skipped). Longer drafts follow from the
        goodput model once acceptance is measured. When even good drafts could not beat plain
        decoding at these costs, there is no probe: speculation stays off."""
        t_draft = 0.0 if self.free_drafts else self.t_draft
        ar_rate = 1.0 / max(self.verify_cost(1), 1e-9)
        if not self.free_drafts:
            # A drafter model's run is judged afresh: its first step is never timed (the drafter catches up on the
            # steps it skipped), so the only timed evidence an earlier probe left is one step each, often one where
            # the drafter declined or was rejected — an average of those vetoed a drafter that pays (the SmolLM2
            # head, accepted 0.54 of the time, drafted on 19 % of steps). Lookup drafts need no catch-up.
            self.spec_steps = 0
        expected, power = 1.0, 1.0
        for g in range(1, self.max_gamma + 1):
            power *= 0.9
            expected += power
            if expected / max(g * t_draft + self.verify_cost(g + 1), 1e-9) > 1.1 * ar_rate:
                self.probing = True
                self.probe = [g]
                return g
        self.probing = True  # counts as a failed probe: the wait before the next look doubles
        return 0

    def _best(self) -> int:
        if self.t_verify[1] is None or (self.spec_steps == 0 and not self.free_drafts):
            return 0  # nothing measured yet: plain steps until the first probe has run
        t_draft = 0.0 if self.free_drafts else self.t_draft
        best, best_rate = 0, 1.0 / max(self.verify_cost(1), 1e-9)
        expected, power, a = 1.0, 1.0, self.accept[1]
        for g in range(1, self.max_gamma + 1):
            if self.tried[g]:
                a = self.accept[g]
            power *= min(a, 0.999)
            expected += power  # E(g) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_g
            rate = expected / max(g * t_draft + self.verify_cost(g + 1), 1e-9)
            if rate > best_rate:
                best, best_rate = g, rate
        ar_rate = 1.0 / max(self.verify_cost(1), 1e-9)
        if best and self.spec_steps >= JUDGED and self.spec_tokens < ar_rate * self.spec_time:
            return 0  # the model says speculate, but measured speculative steps are slower than AR
        return best
