"""KV buffers with a cursor: allocated once, written in place by the graph, rolled back by moving the cursor.

GroupQueryAttention reads the valid length of the past from the attention mask (seqlens_k) and
writes new keys/values at that offset into the buffer bound as both ``past`` and ``present``.
So rejecting drafted tokens is ``rewind_to(n)``: the next pass simply sees a shorter mask and
overwrites the stale rows. Nothing is copied, nothing is reallocated.
"""

from __future__ import annotations

import numpy as np

from edge_spec.errors import EdgeSpecError


class KVCache:
    """Per-layer K and V buffers ``[1, kv_heads, capacity, head_size]`` plus a committed-length cursor.

    Invariant: rows ``[0, length)`` of every buffer hold the keys/values of the tokens the owner
    has fed, in order. Rows at or beyond ``length`` are scratch (maybe stale drafts).
    """

    def __init__(self, num_layers: int, kv_heads: int, head_size: int, capacity: int,
                 dtype: np.dtype = np.float32, scratch: int = 0) -> None:
        self.capacity = capacity
        self.length = 0
        # Each [1, kv_heads, capacity + scratch, head_size]. ``scratch`` rows past the capacity take
        # the keys/values of padding rows (a pass padded to a batch-invariant size writes them and
        # never commits them). np.empty + fill touches every page now, so resident memory is paid
        # at load (as the plan says) and does not creep up with context.
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        for _ in range(num_layers):
            for bucket in (self.keys, self.values):
                buf = np.empty((1, kv_heads, capacity + scratch, head_size), dtype=dtype)
                buf.fill(0)
                bucket.append(buf)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.keys) + sum(b.nbytes for b in self.values)

    @property
    def free(self) -> int:
        return self.capacity - self.length

    def commit(self, n: int) -> None:
        """The last pass wrote ``n`` new rows at the cursor; make them part of the context."""
        if self.length + n > self.capacity:
            raise EdgeSpecError(f"The KV cache holds {self.capacity} tokens and cannot take {n} more; "
                                "raise the memory budget or shorten the conversation.")
        self.length += n

    def rewind_to(self, n: int) -> None:
        """Forget everything from row ``n`` on (only the cursor moves)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"rewind_to({n}) outside [0, {self.length}]")
        self.length = n
