"""KV buffers with a cursor: allocated once, written in place by the graph, rolled back by moving the cursor.

GroupQueryAttention reads the valid length of the past from the attention mask (seqlens_k) and
writes new keys/values at that offset into the buffer bound as both ``past`` and ``present``.
So rejecting drafted tokens is ``rewind_to(n)``: the next pass simply sees a shorter mask and
overwrites the stale rows. Nothing is copied, nothing is reallocated.
"""

from __future__ import annotations

import mmap

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
        # never commits them). All of them are views of ONE anonymous mapping: the address space for
        # the whole context is reserved now (nothing is allocated or copied later), but the kernel
        # commits a page only when a pass first writes it, so resident memory follows the context
        # actually used (a 100-token chat on a 4096-token plan pays for ~100 rows, as ONNX Runtime
        # GenAI, which sizes its cache per request) and never exceeds what the plan reserved.
        # Rewound rows keep their pages: a conversation's peak stays resident until the engine goes.
        shape = (1, kv_heads, capacity + scratch, head_size)
        per = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self._map = mmap.mmap(-1, max(per * 2 * num_layers, 1))  # anonymous, zero-filled on first touch
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        for layer in range(num_layers):
            for i, bucket in enumerate((self.keys, self.values)):
                bucket.append(np.frombuffer(self._map, dtype=dtype, count=int(np.prod(shape)),
                                            offset=(2 * layer + i) * per).reshape(shape))

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
