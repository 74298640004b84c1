"""Drafts from the target's own earlier writing: a static n-gram table (REST; llama.cpp's static lookup cache).

Prompt lookup (:func:`edge_spec.runtime.drafting.lookup_draft`) drafts only where the *current* context repeats
itself. A chat model also repeats itself *across* conversations ("Here's a simple recipe for", "I hope this
helps!"), and ``edge-spec distill`` keeps what the target wrote as token ids (answers files). ``edge-spec export
--ngrams`` counts, over those answers, which token followed each n-gram (n = ``min_n``..``max_n``) and keeps the
n-grams whose most frequent continuation is frequent (``min_count``) and dominant (``min_share``); this module
drafts with them: the longest kept n-gram ending the context gives the next token, again for the token after it,
up to the draft length. The drafts are deterministic and go through the same verification as any other draft, so
they change speed, never the output.

File (bundle-relative ``NgramSpec.file``, ``.npz``): ``keys`` uint64 [entries], sorted, the :func:`ngram_hash` of
each kept n-gram (n is hashed in, so equal ids of different lengths never meet); ``next`` int32 [entries], its
continuation. A hash collision can only make a wrong draft, which verification rejects. ``guess`` int32 [vocab]
(bundles since manifest version 8): each token's most frequent next answer token, unfiltered (-1: none), the
draft for a target pass's padding row (:meth:`NgramTable.guess_after`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edge_spec.errors import BundleError

MULT = 0x9E3779B97F4A7C15  # odd 64-bit multiplier (the golden ratio's): h <- h * MULT + id + 1 (mod 2**64)
MASK = (1 << 64) - 1


def ngram_hash(ids: Sequence[int]) -> int:
    """64-bit hash of one n-gram of token ids (seeded by its length); equals :func:`window_hashes`' entries."""
    h = len(ids)
    for t in ids:
        h = (h * MULT + int(t) + 1) & MASK
    return h


def window_hashes(seq: np.ndarray, n: int) -> np.ndarray:
    """:func:`ngram_hash` of every window ``seq[i:i + n]``, vectorised: uint64 [len(seq) - n + 1] (or empty)."""
    count = len(seq) - n + 1
    if count <= 0:
        return np.zeros(0, np.uint64)
    h = np.full(count, n, np.uint64)
    mult = np.uint64(MULT)
    ids = np.asarray(seq).astype(np.uint64) + np.uint64(1)
    for j in range(n):
        h = h * mult + ids[j:j + count]  # uint64 arithmetic wraps modulo 2**64, as ngram_hash masks
    return h


class NgramTable:
    """Kept n-grams (``keys`` uint64 [E] sorted) -> continuation (``next`` int32 [E]); orders ``min_n``..``max_n``."""

    def __init__(self, keys: np.ndarray, next_ids: np.ndarray, min_n: int, max_n: int,
                 guess: np.ndarray | None = None) -> None:
        self.keys = np.ascontiguousarray(keys, np.uint64)
        self.next = np.ascontiguousarray(next_ids, np.int32)
        self.min_n, self.max_n = int(min_n), int(max_n)
        self.guess = None if guess is None else np.ascontiguousarray(guess, np.int32)  # [vocab] or None

    @classmethod
    def load(cls, path: str | Path, min_n: int, max_n: int, vocab_size: int) -> NgramTable:
        """Read a table file; a damaged one is refused with one sentence (it would only ever draft garbage)."""
        try:
            with np.load(path) as z:
                keys, nxt = z["keys"], z["next"]
                guess = z["guess"] if "guess" in z.files else None
        except (OSError, ValueError, KeyError) as exc:
            raise BundleError(f"The n-gram table '{path}' cannot be read ({exc.__class__.__name__}); the bundle is "
                              "corrupt, re-export it.") from None
        if keys.dtype != np.uint64 or keys.shape != nxt.shape or keys.ndim != 1 or (
                len(keys) and (np.any(keys[1:] <= keys[:-1]) or nxt.min() < 0 or nxt.max() >= vocab_size)):
            raise BundleError(f"The n-gram table '{path}' is malformed (keys must be sorted uint64, ids below "
                              f"{vocab_size}); the bundle is corrupt, re-export it.")
        if guess is not None and (guess.dtype != np.int32 or guess.shape != (vocab_size,) or guess.min() < -1
                                  or guess.max() >= vocab_size):
            raise BundleError(f"The n-gram table '{path}' has a malformed 'guess' array (int32 [{vocab_size}] of ids "
                              "or -1); the bundle is corrupt, re-export it.")
        return cls(keys, nxt, min_n, max_n, guess)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.next.nbytes + (0 if self.guess is None else self.guess.nbytes))

    def guess_after(self, token: int) -> int:
        """The token that most often followed ``token`` in the target's answers (unfiltered), or -1."""
        return -1 if self.guess is None else int(self.guess[token])

    def next_token(self, ctx: Sequence[int]) -> int:
        """Continuation of the longest kept n-gram ending ``ctx``, or -1."""
        for k in range(min(self.max_n, len(ctx)), self.min_n - 1, -1):
            h = np.uint64(ngram_hash(ctx[len(ctx) - k:]))
            i = int(np.searchsorted(self.keys, h))
            if i < len(self.keys) and self.keys[i] == h:
                return int(self.next[i])
        return -1

    def draft(self, tokens: np.ndarray, n: int, max_len: int) -> np.ndarray:
        """Up to ``max_len`` drafts after the context ``tokens[:n]``: int64 [g], g <= max_len (maybe empty)."""
        ctx = [int(t) for t in tokens[max(0, n - self.max_n):n]]
        out: list[int] = []
        while len(out) < max_len:
            t = self.next_token(ctx)
            if t < 0:
                break
            out.append(t)
            ctx = ctx[1:] + [t] if len(ctx) >= self.max_n else ctx + [t]
        return np.asarray(out, np.int64)
