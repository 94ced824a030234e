"""`max_kv_size`: a KV cache bounded to N positions, as mlx-lm's `--max-kv-size`.

mlx-lm bounds the cache with `RotatingKVCache(max_size=N, keep=4)`: the first 4
positions stay (attention sinks) and the rest is a window of the latest N - 4.
Token by token that is exact: every position attends to the 4 kept ones and the
N - 4 latest, itself included.  But fed a block of positions at once (a verify
pass: the pending token plus the drafts), mlx-lm's cache keeps N - 1 older
positions beside the block and masks them with a plain sliding window of N,
which hides the kept positions from all but the first row; the block's logits
then differ from token-by-token decoding and speculation would not be lossless.

`WindowKVCache` is mlx-lm's RotatingKVCache with one change: the mask of a
multi-position call gives every row exactly what token-by-token decoding gives
it (the kept positions and its own window of N - keep), computed from the
positions the cache will hold after the call.  A one-position call is mlx-lm's
own code.  So the target's greedy output equals mlx-lm's token-by-token decoding
with `RotatingKVCache(N, keep=4)`, however the positions are grouped into
passes (prefill chunks, verify passes, re-fed positions after a rollback).

Rollback past the window uses core/recurrent.py's checkpoints (a RotatingKVCache
cannot be trimmed once it has wrapped); token trees need a full KV cache, so a
bounded cache verifies chains (tree_round.tree_unsupported says why).

`bounded(cache, N)` swaps each full `KVCache` of a model's cache list for a
WindowKVCache(N).  Unlike mlx-lm, whose `make_prompt_cache(model, N)` ignores N
for models that build their own cache list (llama -- SmolLM2 among them --,
gemma3, hybrids), it bounds those models' full-attention layers too; their own
sliding-window and recurrent layers stay as they are.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache

from .options import KV_KEEP as KEEP  # the first positions always kept, as mlx-lm's make_prompt_cache


class WindowKVCache(RotatingKVCache):
    def __init__(self, max_size: int, keep: int = KEEP):
        if max_size <= keep:
            raise ValueError(f"max_size must exceed keep ({keep}), got {max_size}")
        super().__init__(max_size=max_size, keep=keep)

    def held_positions(self) -> mx.array:
        """The positions the cache holds, in the order a multi-position update
        lays them out before appending (RotatingKVCache._update_concat: temporal
        order, then trimmed to max_size - 1)."""
        if self.keys is None:
            return mx.arange(0)
        n = self.keys.shape[2] if self._idx == self.keys.shape[2] or self._idx < self.offset else self._idx
        n = min(n, self.max_size - 1)
        if n >= self.offset:
            return mx.arange(self.offset)
        return mx.concatenate([mx.arange(self.keep), mx.arange(self.offset - (n - self.keep), self.offset)])

    def make_mask(self, N: int, window_size=None, return_array: bool = False):
        if N == 1 or window_size is not None:
            return super().make_mask(N, window_size=window_size, return_array=return_array)
        rows = mx.arange(self.offset, self.offset + N)
        cols = mx.concatenate([self.held_positions(), rows])[None]
        rows = rows[:, None]
        return (cols <= rows) & ((cols < self.keep) | (rows - cols < self.max_size - self.keep))


def bounded(cache: list, max_kv_size: int | None) -> list:
    """`cache` with every full KVCache replaced by a WindowKVCache(max_kv_size)."""
    if max_kv_size is None:
        return cache
    return [WindowKVCache(max_kv_size) if type(c) is KVCache else c for c in cache]


def is_bounded(cache: list) -> bool:
    return any(isinstance(c, WindowKVCache) for c in cache)
