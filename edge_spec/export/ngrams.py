"""Build a bundle's static n-gram draft table from the target's own answers (``edge-spec export --ngrams``).

Input: answers files of ``edge-spec distill`` for the bundle's target (``OUT/data/answers.npz``; the demo's are
committed in ``models/smollm2-data``), read and de-duplicated as distill reads them; held-out conversations are left
out, so acceptance measured on them stays honest. For every answer token (and the end-of-turn token after it), its
preceding n tokens, n = ``MIN_N``..``MAX_N`` (the last tokens of the prompt's template included for the first
answer tokens), are counted against it; an n-gram is kept when its most frequent continuation is at least
``MIN_COUNT`` of its occurrences and at least ``MIN_SHARE`` of them. Beside the table, the file keeps one unfiltered
*guess* per token: the token that most often followed it (:func:`guess_table`), which the runtime drafts only where a
draft costs nothing (the padding row of a target pass, see :mod:`edge_spec.runtime.speculative`). The runtime side and
the file format are in :mod:`edge_spec.runtime.ngrams`.

Why these settings: on the demo (SmolLM2-135M-Instruct, 1.3 M answer tokens), replaying the target's answers to the
benchmark chat prompts (none in the data) drafted most where these thresholds keep drafts right about twice as
often as the drafter model (BENCHMARKS.md, "Drafts from the target's own writing").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from edge_spec.bundle import NGRAM_ENTRY_BYTES, NgramSpec
from edge_spec.errors import EdgeSpecError, ExportError
from edge_spec.runtime.ngrams import window_hashes

MIN_N, MAX_N = 2, 4
MIN_COUNT = 3
MIN_SHARE = 0.6
FILE = "ngrams.npz"


def count_table(seqs: Sequence[tuple[np.ndarray, int]], min_n: int = MIN_N, max_n: int = MAX_N,
                min_count: int = MIN_COUNT, min_share: float = MIN_SHARE) -> tuple[np.ndarray, np.ndarray]:
    """Kept (keys uint64 [E] sorted, next int32 [E]) over ``seqs`` = (ids int [L], prompt length) pairs."""
    hashes, nexts = [], []
    seqs = [(np.asarray(ids, np.int64), prompt_len) for ids, prompt_len in seqs]
    for n in range(min_n, max_n + 1):
        for ids, prompt_len in seqs:
            h = window_hashes(ids[:-1], n)  # h[j]: ids[j:j + n], followed by ids[j + n]
            first = max(prompt_len - n, 0)  # the first window whose next token is an answer token
            if first < len(h):
                hashes.append(h[first:])
                nexts.append(ids[first + n:])
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0, np.int32)
    h = np.concatenate(hashes)
    nx = np.concatenate(nexts)
    order = np.lexsort((nx, h))  # by hash, then next id
    h, nx = h[order], nx[order]
    pair_start = np.flatnonzero(np.r_[True, (h[1:] != h[:-1]) | (nx[1:] != nx[:-1])])
    count = np.diff(np.r_[pair_start, len(h)])  # occurrences of each distinct (n-gram, next) pair
    ph, pn = h[pair_start], nx[pair_start]
    order = np.lexsort((pn, -count, ph))  # by hash; within a hash the most frequent next first (ties: smaller id)
    ph, pn, count = ph[order], pn[order], count[order]
    first = np.flatnonzero(np.r_[True, ph[1:] != ph[:-1]])
    total = np.add.reduceat(count, first)
    best = count[first]
    keep = (best >= min_count) & (best >= min_share * total)
    return ph[first][keep], pn[first][keep].astype(np.int32)


def guess_table(seqs: Sequence[tuple[np.ndarray, int]], vocab_size: int) -> np.ndarray:
    """int32 [vocab_size]: for each token, the answer token that most often followed it over ``seqs`` = (ids int
    [L], prompt length) pairs (ties: the smaller id; the last prompt token counts as context of the first answer
    token), -1 for a token never seen before an answer token."""
    prev, nxt = [], []
    for ids, prompt_len in seqs:
        ids = np.asarray(ids, np.int64)
        first = max(prompt_len - 1, 0)
        prev.append(ids[first:-1])
        nxt.append(ids[first + 1:])
    guess = np.full(vocab_size, -1, np.int32)
    if not prev:
        return guess
    pair, count = np.unique(np.concatenate(prev) * vocab_size + np.concatenate(nxt), return_counts=True)
    a, b = pair // vocab_size, pair % vocab_size
    order = np.lexsort((b, -count, a))  # by context token; the most frequent next first (ties: smaller id)
    a, b = a[order], b[order]
    first = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    guess[a[first]] = b[first]
    return guess


def build(files: Sequence[Path], out_dir: Path, target_sha256: str, vocab_size: int,
          say: Callable[[str], None] = lambda _m: None) -> NgramSpec:
    """Read ``files`` (answers of the target with ``target_sha256``), write ``out_dir/ngrams.npz``, return its spec."""
    from edge_spec.distill import ids as answers  # the export extra: distill's own reader, its checks and de-dup

    for f in files:
        if not Path(f).is_file():
            raise ExportError(f"The answers file '{f}' does not exist; pass the data/answers.npz of an edge-spec "
                              "distill run for this target.")
    try:
        train, _held, meta = answers.read_many([Path(f) for f in files])
    except EdgeSpecError as exc:  # not an answers file, or answers of two different targets: distill's sentence
        raise ExportError(str(exc)) from None
    sha = meta.get("target_sha256")
    if sha is not None and sha != target_sha256:
        raise ExportError(f"--ngrams '{files[0]}' holds answers written by another model (sha256 {sha[:12]}...) than "
                          f"this target ({target_sha256[:12]}...); pass answers of edge-spec distill for this target.")
    seqs = [(s.ids, s.prompt_len) for s in train]
    top = max((int(s.max()) for s, _ in seqs if len(s)), default=-1)
    if top >= vocab_size:
        raise ExportError(f"--ngrams '{files[0]}' holds token id {top}, outside this target's vocabulary of "
                          f"{vocab_size}; pass answers of edge-spec distill for this target.")
    keys, nxt = count_table(seqs)
    guess = guess_table(seqs, vocab_size)
    np.savez(out_dir / FILE, keys=keys, next=nxt, guess=guess)
    tokens = sum(len(ids) - pl for ids, pl in seqs)
    say(f"[ngrams] {len(keys):,} n-grams ({MIN_N}..{MAX_N} tokens, continuation seen >= {MIN_COUNT} times and in "
        f">= {MIN_SHARE:.0%} of cases) from {tokens:,} answer tokens of {len(seqs):,} conversations: "
        f"{NGRAM_ENTRY_BYTES * len(keys) / 2**20:.1f} MiB; guesses for {int((guess >= 0).sum()):,} tokens "
        f"({guess.nbytes / 2**20:.1f} MiB)")
    return NgramSpec(file=FILE, entries=int(len(keys)), bytes=NGRAM_ENTRY_BYTES * int(len(keys)), min_n=MIN_N,
                     max_n=MAX_N, min_count=MIN_COUNT, min_share=MIN_SHARE, sequences=len(seqs), tokens=int(tokens),
                     guess_bytes=int(guess.nbytes))
