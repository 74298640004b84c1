"""The draft-verify loop.

State: the committed tokens ``ctx.tok[:ctx.n]`` (prompt + accepted output) and two models that
take tokens and return logits (:class:`edge_spec.runtime.session.ModelSession`, or a scripted
fake in tests). Invariant between steps, kept by :meth:`Decoder.sync_kv`: each model's KV holds
a prefix of the committed tokens and never the last one, which is fed at the next step.
Whatever a model has not seen yet ("pending") is fed first, in one pass with the new work:
the prompt on the first step, one token normally, two after an all-accepted step (below).

Drafts come from the drafter model, from prompt lookup (an earlier occurrence of the context's
last n-gram), or from both (hybrid): then lookup drafts first whenever the committed context has
a match of at least ``lookup_ngram_min`` tokens and its own draft-length policy wants drafts,
and the drafter drafts otherwise. Where the context repeats no 2-3 tokens, a bundle's static n-gram
table (the target's own writing in other conversations, :mod:`edge_spec.runtime.ngrams`) may supply
the lookup draft instead, before a repeat of the last token alone (right about a third as often
as the table's on code: BENCHMARKS.md, "Which lookup draft goes first"). Lookup drafts are
deterministic (q is one-hot), cost nothing to make, and go through the same verify rule, so every
output guarantee holds whatever the source.

Where lookup drafting is on, a step that drafted nothing carries a guess for the next token as a one-token draft
(:meth:`Decoder.draft_guess`: a repeat in the context, the n-gram table, the table's unfiltered guess for the last
token) in a second row (``ModelSession.guess_rows``): free where the target graph runs a 1-token pass as two
anyway (export/invariance.py); ~1.1x a one-row pass on a graph that needs no padding, where a one-token
:class:`DraftPolicy` of its own keeps guessing only while the measured goodput of guessing beats plain steps.
The draft-length policies never see it (it is not a choice they made): to them the step drafted nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edge_spec.runtime.drafting import DraftPolicy, lookup_draft
from edge_spec.runtime.logprobs import TokenLogprob, token_logprobs
from edge_spec.runtime.ngrams import NgramTable
from edge_spec.runtime.sampling import (
    Noise,
    Rejection,
    RowProbs,
    SamplingConfig,
    draft_sampling,
    probs,
    top_probability,
    verify,
    verify_greedy,
    verify_rejection,
)


class Model(Protocol):
    """The backend seam: a model that takes tokens and returns logits.

    Feature drafting (EAGLE-3) grows it by two attributes: a target may hold ``features``
    [positions, F] (row p = its hidden-state features at position p, valid below ``length``, written
    by its own passes), and a drafter with ``reads_features`` takes ``forward(tokens, features)``:
    with features [k, F] the rows read the target's, without (one token) the drafter continues
    from its own last output, as it was trained."""

    max_rows: int  # most tokens one forward may take
    capacity: int  # KV positions
    length: int  # KV positions filled (the cursor)
    vocab_size: int  # width of the logits

    def forward(self, tokens: np.ndarray) -> np.ndarray: ...  # [k] -> [k, vocab], advances length by k
    def rewind_to(self, n: int) -> None: ...


def last_rows(model: Model, tokens: np.ndarray, keep: int) -> np.ndarray:
    """Feed ``tokens`` [k]; the logits of the last ``keep`` of them [min(keep, k), vocab]. A session that
    ``skips_logits`` (runtime/session.py) computes only those rows' LM head — the same numbers."""
    if getattr(model, "skips_logits", False):
        return model.forward(tokens, keep=keep)
    return model.forward(tokens)[-keep:]


@dataclass
class Step:
    tokens: list[int]  # newly committed target ids
    from_drafter: list[bool]
    gamma: int
    accepted: int
    finish: str | None  # None, "stop_token", "length", "context_full"
    lookup: bool = False  # the drafts came from prompt lookup (not the drafter model)
    table: bool = False  # ... from the bundle's n-gram table (a kind of lookup draft: lookup is True too)
    guess: bool = False  # ... the guess in a 1-token step's second row (module docstring; lookup is True too)
    logprobs: list[TokenLogprob] | None = None  # per committed token, when decode() is asked for them


class Decoder:
    def __init__(self, target: Model, drafter: Model | None, *, lookup: bool = False,
                 id_map: np.ndarray | None = None, max_gamma: int = 0, lookup_ngram_min: int | None = None,
                 table: NgramTable | None = None) -> None:
        self.target, self.drafter, self.lookup = target, drafter, lookup
        self.table = table  # static n-gram drafts where the context has no match (lookup drafting only)
        self.table_drafts = False  # the current lookup drafts came from the table
        # Alone, any repeated token is worth a guess; next to a drafter a 1-token match is a worse bet than the model.
        self.lookup_ngram_min = (1 if drafter is None else 2) if lookup_ngram_min is None else lookup_ngram_min
        self.deterministic = drafter is None  # the current drafts are lookup drafts (q one-hot)
        self.id_map = id_map  # [K] drafter id -> target id, or None
        self.capacity = target.capacity if drafter is None else min(target.capacity, drafter.capacity)
        self.tok = np.zeros(self.capacity + 1, dtype=np.int64)  # [capacity + 1] committed tokens
        self.n = 0
        self.max_gamma = max_gamma
        dv = 1 if drafter is None else drafter.vocab_size
        # float32 like the logits: half the memory traffic of float64 in the per-token transform
        self.q = np.zeros((1, dv), dtype=np.float32)  # [1, drafter vocab] q of the current draft
        # q over target ids (0 outside a trimmed drafter's kept set): the race's noise is per target id
        self.q_full = np.zeros(target.vocab_size if id_map is not None else 1, dtype=np.float32)  # [target vocab]
        self.p = np.zeros((max_gamma + 1, target.vocab_size), dtype=np.float32)  # [max_gamma + 1, target vocab]
        self.drafts = np.zeros(max(max_gamma, 1), dtype=np.int64)  # [max_gamma] target-space ids
        # q of each draft over target ids, kept for the rejection rule (unseeded sampling only)
        self.qd = np.zeros((max(max_gamma, 1), target.vocab_size if drafter is not None else 1),
                           dtype=np.float32)  # [max_gamma, target vocab]
        self.t_draft = self.t_verify = 0.0
        self.drafter_passes = 0  # passes of the last draft() (counts a pass that produced no confident draft)
        # A feature drafter (EAGLE-3) reads the target's features at committed positions: its row p takes
        # (features at p, token p + 1) and predicts token p + 2, so it trails the target and catches up on
        # the rows the last verify committed; its draft rows (own outputs) are dropped after every draft.
        self.reads_features = bool(getattr(drafter, "reads_features", False))
        if self.reads_features and getattr(target, "features", None) is None:
            raise ValueError("a feature drafter needs a target that writes features")
        self.verified_from = 0  # the target's length when the last verify pass started
        # [g + 1, V] the last verify pass's target logits (a view, valid until the next target pass): row i is the
        # distribution of the i-th token that pass commits, in speculative and plain decoding alike
        self.logits = np.zeros((0, target.vocab_size), dtype=np.float32)

    # -- committed context -------------------------------------------------------------
    def set_context(self, ids: np.ndarray) -> int:
        """Make ``ids`` the committed tokens, keeping KV for the longest common prefix. Returns its length."""
        m = min(self.n, len(ids))
        diff = np.flatnonzero(self.tok[:m] != ids[:m])
        common = int(diff[0]) if len(diff) else m
        self.tok[:len(ids)] = ids
        self.n = len(ids)
        self.sync_kv(common)
        return common

    def sync_kv(self, limit: int | None = None) -> None:
        """THE rewind, for both models: keep KV only for committed tokens (and never the last one).

        Called after every step (drops rejected drafts), from ``finally`` when a stream is
        interrupted, and when the context is replaced (chat turns, reset)."""
        keep = max(self.n - 1, 0) if limit is None else min(limit, max(self.n - 1, 0))
        for model in (self.target, self.drafter):
            if model is not None and model.length > keep:
                model.rewind_to(keep)

    def _feed(self, model: Model, extra: np.ndarray) -> np.ndarray:
        """Feed the model's pending committed tokens, then ``extra``; logits of the last len(extra)+1 positions."""
        room = model.max_rows - len(extra)
        while self.n - model.length > room:  # long prompt: prefill in chunks, logits unused
            last_rows(model, self.tok[model.length:min(self.n - 1, model.length + model.max_rows)], 1)
        pending = self.tok[model.length:self.n]
        if len(extra):
            pending = np.concatenate((pending, extra))  # <= max_rows ints
        return last_rows(model, pending, len(extra) + 1)

    def backlog(self, gamma: int) -> int:
        """Most committed tokens a model taking part in this step has yet to see.

        1 normally, 2 after an all-accepted step; more when a prompt is pending, or for the
        drafter after a stretch of plain AR steps (it is not fed while gamma is 0)."""
        if gamma == 0 or self.drafter is None:
            return self.n - self.target.length
        if self.reads_features:  # normally it catches up on exactly the last verify's committed rows
            return max(self.n - self.target.length, self.verified_from - self.drafter.length + 1)
        return max(self.n - m.length for m in (self.target, self.drafter))

    # -- one step ------------------------------------------------------------------------
    def draft(self, gamma: int, cfg: SamplingConfig, noise: Noise | Rejection, threshold: float,
              qcfg: SamplingConfig) -> int:
        """Fill ``self.drafts[:g]`` (target ids); returns g <= gamma. ``cfg`` is the target's sampling, ``qcfg`` the
        drafts' (:func:`draft_sampling`; a greedy target drafts greedily whatever it says). Sampled drafts race q
        against the noise the target will race p against at the same positions (see :func:`verify`), or, unseeded,
        are drawn from q, which is kept for the rejection rule (one-hot at the draft when ``qcfg`` is greedy)."""
        if self.drafter is None:
            return self.draft_lookup(gamma)
        self.t_draft = 0.0
        self.drafter_passes = 0
        self.deterministic = False
        if gamma == 0:
            return 0
        t0 = time.perf_counter()
        d = self.drafter
        if self.reads_features:
            logits = self._catch_up_features()
            if logits is None:  # a one-token context: no features to read yet
                self.t_draft = time.perf_counter() - t0
                return 0
            caught_up = d.length
        else:
            # Catch-up lives here: after a step where every draft was accepted, the drafter never saw
            # the last draft (it is sampled, not fed), so two committed tokens are pending
            # [last draft, bonus] and _feed sends both in this one pass instead of an extra step.
            logits = self._feed(d, self.tok[:0])[0]
        g = 0
        self.drafter_passes = 1
        qcfg = cfg if cfg.greedy else qcfg
        while True:
            # The confidence gate reads the drafter's top probability at the target's temperature (1 when greedy),
            # before filters: how sure the drafter is, whatever temperature its drafts are drawn at.
            if threshold > 0 and top_probability(logits, cfg) < threshold:
                break
            if qcfg.greedy:
                j = int(logits.argmax())
                x = int(self.id_map[j]) if self.id_map is not None else j
                if not cfg.greedy and noise.keeps_q:  # a deterministic draft: q is one-hot at it
                    self.qd[g] = 0.0
                    self.qd[g, x] = 1.0
            else:
                q = probs(logits[None], qcfg, out=self.q)[0]
                if self.id_map is not None:
                    self.q_full[self.id_map] = q  # the rest stays 0: the kept ids never change
                    q = self.q_full
                x = noise.race(q, self.n + g)  # a target id, raced with the noise the target will use here
                if noise.keeps_q:
                    self.qd[g] = q
            self.drafts[g] = x
            g += 1
            if g == gamma:
                break  # the last draft is not fed: the drafter stays one behind if all are accepted
            logits = d.forward(self.drafts[g - 1:g])[0]  # the drafter embeds full-vocab (target) ids
            self.drafter_passes += 1
        if self.reads_features:
            d.rewind_to(caught_up)  # draft rows read the drafter's own outputs: never kept as context
        self.t_draft = time.perf_counter() - t0
        return g

    def _catch_up_features(self) -> np.ndarray | None:
        """Bring the target to n - 1 committed rows (a pending prompt: prefill, logits unused) and feed the
        feature drafter every committed row it has not read: row p = (features at p, token p + 1). Returns the
        drafter's logits at row n - 2 (the first draft), or None when the context has one token."""
        t, d = self.target, self.drafter
        while t.length < self.n - 1:
            last_rows(t, self.tok[t.length:min(self.n - 1, t.length + t.max_rows)], 1)
        if t.length == 0:
            return None
        if d.length >= t.length:  # a repeated draft without a verify in between: redo the last row
            d.rewind_to(t.length - 1)
        while d.length < t.length:
            a = d.length
            b = min(t.length, a + d.max_rows)
            logits = d.forward(self.tok[a + 1:b + 1], t.features[a:b])
        return logits[-1]

    def draft_lookup(self, gamma: int) -> int:
        """Fill ``self.drafts[:g]`` with the continuation of the latest earlier match of the context's last 2-3
        tokens, else with the n-gram table's draft, else (``lookup_ngram_min`` 1) with what followed the last
        token's latest earlier occurrence; returns g <= gamma, 0 when none has one."""
        self.t_draft = 0.0
        self.drafter_passes = 0
        self.deterministic = True
        got = lookup_draft(self.tok, self.n, gamma, ngram_min=max(2, self.lookup_ngram_min)) if gamma > 0 \
            else self.tok[:0]
        self.table_drafts = False
        if not len(got) and gamma > 0 and self.table is not None:
            got = self.table.draft(self.tok, self.n, gamma)
            self.table_drafts = bool(len(got))
        if not len(got) and gamma > 0 and self.lookup_ngram_min < 2:
            got = lookup_draft(self.tok, self.n, gamma, ngram_min=self.lookup_ngram_min)
        self.drafts[:len(got)] = got
        return len(got)

    def draft_guess(self) -> int:
        """After a step's drafting made no draft: a one-token draft for the target pass's second row, when it may
        have one (pending tokens + 1 <= the target's ``guess_rows``) and lookup drafting is on. The best guess: an
        earlier occurrence of the context's last 2-3 tokens, else the n-gram table's, else the table's unfiltered
        ``guess`` for the last token, else an earlier occurrence of the last token. Returns 1, or 0 (none)."""
        if not self.lookup or self.n == 0 or self.n - self.target.length + 1 > getattr(self.target, "guess_rows", 1):
            return 0
        got, table = lookup_draft(self.tok, self.n, 1, ngram_min=2), False
        if not len(got) and self.table is not None:
            got = self.table.draft(self.tok, self.n, 1)
            if not len(got) and (x := self.table.guess_after(int(self.tok[self.n - 1]))) >= 0:
                got = np.array([x])
            table = bool(len(got))
        if not len(got):
            got = lookup_draft(self.tok, self.n, 1, ngram_min=1)
        if not len(got):
            return 0
        self.drafts[0] = got[0]
        self.deterministic, self.table_drafts = True, table
        return 1

    def verify(self, g: int, cfg: SamplingConfig, noise: Noise | Rejection) -> tuple[int, int]:
        """One target pass over pending + drafts; returns (accepted, next token)."""
        t0 = time.perf_counter()
        self.verified_from = self.target.length
        logits = self.logits = self._feed(self.target, self.drafts[:g])  # [g + 1, V]
        if cfg.greedy:
            out = verify_greedy(logits, self.drafts[:g])
        elif noise.keeps_q:
            q = None if self.deterministic else self.qd[:g]  # None: deterministic (lookup) drafts
            out = verify_rejection(RowProbs(logits, cfg, self.p[:g + 1]), q, self.drafts[:g], noise)
        else:  # rows up to the first rejection only (RowProbs)
            out = verify(RowProbs(logits, cfg, self.p[:g + 1]), self.drafts[:g], noise, self.n)
        self.t_verify = time.perf_counter() - t0
        return out

    def accept(self, g: int, accepted: int, nxt: int, stop_ids: frozenset[int], budget: int,
               guess: bool = False) -> Step:
        """Commit accepted drafts + next token, cut at a stop token or the token budget, rewind KV. ``guess``: the
        draft was :meth:`draft_guess`'s."""
        new = [int(x) for x in self.drafts[:accepted]] + [nxt]
        flags = [True] * accepted + [False]
        finish = None
        for i, t in enumerate(new):
            if t in stop_ids:
                new, flags, finish = new[:i + 1], flags[:i + 1], "stop_token"
                break
        if len(new) >= budget:
            new, flags = new[:budget], flags[:budget]
            finish = finish or "length"
        self.tok[self.n:self.n + len(new)] = new
        self.n += len(new)
        self.sync_kv()
        return Step(new, flags, g, min(accepted, len(new)), finish, lookup=self.deterministic and g > 0,
                    table=self.deterministic and self.table_drafts and g > 0, guess=guess and g > 0)


def decode(dec: Decoder, cfg: SamplingConfig, policy: DraftPolicy | None, noise: Noise | Rejection,
           max_new_tokens: int, stop_ids: frozenset[int], threshold: float = 0.0,
           lookup_policy: DraftPolicy | None = None, qcfg: SamplingConfig | None = None,
           logprobs: int | None = None, guesser: DraftPolicy | None = None) -> Iterator[Step]:
    """Generate up to ``max_new_tokens`` after the committed context, one step per yield.

    ``policy`` sets the draft length of ``dec.draft`` (the drafter model, or lookup when there is
    none). ``lookup_policy`` (hybrid drafting: a drafter model *and* lookup) sets the length of
    lookup drafts, which go first when the context has a match; each policy learns acceptance
    from its own steps and step costs from all of them.

    Seeded (``Noise``): sampled tokens are races against the noise at their absolute positions, so
    the output is the same for any sequence of draft lengths (and with speculation off).
    Unseeded (``Rejection``): the rejection rule, which accepts more drafts. ``qcfg``: the drafter's sampling
    (default :func:`draft_sampling` of ``cfg``: sharper than the target's; any q keeps the output exact).
    ``logprobs`` (None: off): each step carries its tokens' log-probabilities with that many alternatives, read from
    the verify pass's rows (:mod:`edge_spec.runtime.logprobs`). ``guesser`` (a one-token ``DraftPolicy`` with
    free drafts; None: guess whenever a second row is available, as on a padded graph, where it is paid for anyway)
    decides whether a step without drafts carries a guess, from its measured goodput (acceptance, 1- and 2-row
    pass costs); the engine keeps one for a target graph that needs no padding row."""
    qcfg = draft_sampling(cfg) if qcfg is None else qcfg
    made = 0
    try:
        while made < max_new_tokens:
            room = dec.capacity - dec.n  # positions left for this step's drafts
            if room < 0:
                yield Step([], [], 0, 0, "context_full")
                return
            left = max_new_tokens - made - 1  # drafts beyond this could never be committed
            g, used = 0, policy
            if lookup_policy is not None:
                gl = min(lookup_policy.next_gamma(), room, left)
                g = dec.draft_lookup(gl) if gl > 0 else 0
                used = lookup_policy if g else policy
                timed = dec.backlog(0) <= 2
            if used is policy:
                gamma = 0 if policy is None else min(policy.next_gamma(), room, left)
                timed = dec.backlog(gamma) <= 2  # a step that also prefills says nothing about step costs
                g = dec.draft(gamma, cfg, noise, threshold, qcfg)
            guess = g == 0 and policy is not None and room >= 1 and left >= 1 and (
                guesser is None or guesser.next_gamma() > 0)
            if guess:
                g = dec.draft_guess()  # the second row's guess (module docstring)
            accepted, nxt = dec.verify(g, cfg, noise)
            step = dec.accept(g, accepted, nxt, stop_ids, max_new_tokens - made, guess)
            if logprobs is not None:  # before the next target pass reuses the logits buffer
                step.logprobs = token_logprobs(dec.logits, step.tokens, cfg, logprobs)
            pg, pa = (0, 0) if step.guess else (g, accepted)  # what the policies chose and got
            if used is not None:  # every step, timed or not: the re-probe countdown must advance (a guess's
                # pass has two rows: not the cost of the plain step the policy chose)
                used.update(pg, pa, dec.t_draft, dec.t_verify, dec.drafter_passes,
                            timed=timed and (guesser is None or not step.guess))
            if guesser is not None and pg == 0 and policy is not None:  # a step the policies left without drafts
                guesser.update(int(step.guess), step.accepted, 0.0, dec.t_verify, timed=timed)
            if lookup_policy is not None and used is not lookup_policy:
                # a step without lookup drafts: lookup's re-probe countdown advances, its cost table learns
                lookup_policy.update(0, 0, 0.0, dec.t_verify, timed=False)
            for other in (policy, lookup_policy):
                if other is not None and other is not used and timed:
                    other.observe(pg + 1, dec.t_verify)
            made += len(step.tokens)
            yield step
            if step.finish:
                return
    finally:
        dec.sync_kv()  # an interrupted step leaves no uncommitted rows behind
