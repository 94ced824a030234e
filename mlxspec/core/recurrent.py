"""Exact rollback for recurrent layers (state-space models, linear attention).

Attention layers roll back by trimming their KV cache.  A recurrent layer
(Mamba, gated delta-net, LFM2's short convolution: an mlx_lm `ArraysCache`)
keeps one state that folds in every token fed; there is nothing to trim.  But
MLX arrays are immutable values and mlx_lm's layers replace a state with a new
array (`cache[i] = new`), never write into it, so keeping the references of a
layer's state arrays *is* a snapshot, for free: no copy, no extra compute.

`Checkpoints` records such a snapshot after every forward call (position = the
number of tokens the cache has folded in).  To roll back to `keep` tokens,
`roll_back` restores the recurrent layers from the newest checkpoint at or
before `keep` and trims every attention layer to that same position; the
caller then feeds the history again from there.  So a partly rejected round
costs re-fed positions in the next pass, never an extra pass:

* the target records a checkpoint before its verify pass (the end of the
  previous pass) and after it; on a rejection it goes back to the one before,
  and the accepted tokens ride along in the next verify pass (`refed` counts
  them).  Should that pass be rejected too, it would go back to the same old
  checkpoint and re-feed ever more; so beyond a few positions (`merge_limit`,
  from the cost model) the re-fed tokens get a model call of their own inside
  the same lazy graph, and a checkpoint right after them;
* a draft model steps one token per forward, so it has a checkpoint at every
  position it may be rolled back to and never re-feeds.

A sliding-window (rotating) KV cache is trimmable only until it wraps: past its
window, a trim cannot bring back the positions the rejected tokens overwrote.
Its checkpoint is new handles of its key/value arrays (writes into the cache's
own arrays leave them alone) plus its offsets; a rollback uses the checkpoints
once a window has wrapped, and plain trimming before.

Mixed lists (some layers attention, some recurrent; `CacheList` nests both) are
handled leaf by leaf.  `rollback_problem` names what cannot be rolled back
exactly (a cache kind that neither trims nor is a plain array state).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache

MAX_ANCHORS = 2  # older checkpoints kept where a prefill ended (a new turn, a regenerated reply)


def leaves(cache) -> list:
    """The per-layer caches, with `CacheList`s flattened."""
    out = []
    for c in cache:
        out.extend(leaves(c.caches) if isinstance(c, CacheList) else [c])
    return out


def is_recurrent(c) -> bool:
    return isinstance(c, ArraysCache)


def snapshotted(c) -> bool:
    return isinstance(c, (ArraysCache, RotatingKVCache))


def wrapped(c) -> bool:
    return isinstance(c, RotatingKVCache) and c.offset >= c.max_size


def state_arrays(cache) -> list:
    """Every array the cache holds, for mx.eval."""
    out = []
    for c in leaves(cache):
        if is_recurrent(c):
            out.extend(a for a in c.cache if a is not None)
        else:
            out.extend(a for a in (getattr(c, "keys", None), getattr(c, "values", None)) if a is not None)
    return out


def has_recurrent(model) -> bool:
    """Does the model keep a recurrent state (so a rejection costs re-fed positions)?"""
    from mlx_lm.models.cache import make_prompt_cache

    return any(is_recurrent(c) for c in leaves(make_prompt_cache(model)))


def rollback_problem(cache) -> str | None:
    """Why this (fresh) cache cannot be rolled back exactly, or None if it can."""
    bad = sorted({type(c).__name__ for c in leaves(cache)
                  if not snapshotted(c) and not (hasattr(c, "trim") and hasattr(c, "offset") and c.is_trimmable())})
    if bad:
        return f"its {', '.join(bad)} layers can neither be trimmed nor snapshotted"
    return None


def cached_positions(cache) -> int:
    """The most positions any attention layer holds (0 for a recurrent-only model)."""
    return max((c.offset for c in leaves(cache) if not is_recurrent(c)), default=0)


def _handle(a):
    """A new array object for the same value: the cache's in-place writes
    (`keys[..., i, :] = k`) replace what its own object holds, not this one."""
    return None if a is None else mx.stop_gradient(a)


def _snapshot(c):
    if is_recurrent(c):
        return list(c.cache)
    return _handle(c.keys), _handle(c.values), c.offset, c._idx


def _put(c, state) -> None:
    if is_recurrent(c):
        c.cache = list(state) if state is not None else [None] * len(c.cache)
        c.lengths = c.left_padding = None
    else:
        k, v, c.offset, c._idx = state if state is not None else (None, None, 0, 0)
        c.keys, c.values = _handle(k), _handle(v)


class Checkpoints:
    """Snapshots of the recurrent (and sliding-window) layers, by position (sorted)."""

    def __init__(self, cache):
        self.layers = [c for c in leaves(cache) if snapshotted(c)]
        self.points: list[tuple[int, list, bool]] = []  # (position, states, anchor)

    def __bool__(self) -> bool:
        return bool(self.layers)

    def record(self, position: int, anchor: bool = False) -> None:
        self.drop_after(position - 1)
        self.points.append((position, [_snapshot(c) for c in self.layers], anchor))

    def drop_after(self, position: int) -> None:
        while self.points and self.points[-1][0] > position:
            self.points.pop()

    def mark(self) -> int:
        return len(self.points)

    def thin(self, mark: int) -> None:
        """Keep only the newest of the checkpoints recorded since `mark` (a long
        prefill keeps one state, not one per chunk), and make it an anchor."""
        if len(self.points) > mark:
            pos, states, _ = self.points[-1]
            del self.points[mark:]
            self.points.append((pos, states, True))

    def newest_at(self, keep: int) -> int:
        """The position `restore(keep)` would go back to, changing nothing."""
        return next((p[0] for p in reversed(self.points) if p[0] <= keep), 0)

    def restore(self, keep: int) -> int:
        """Put the snapshotted layers back to the newest checkpoint at or before
        `keep` (none: their empty start state); return its position."""
        self.drop_after(keep)
        pos, states = (self.points[-1][0], self.points[-1][1]) if self.points else (0, [None] * len(self.layers))
        for c, s in zip(self.layers, states):
            _put(c, s)
        self.prune()
        return pos

    def prune(self) -> None:
        """Keep the newest checkpoint and the last few anchors: a state per round
        in flight, not one per token generated."""
        older = [p for p in self.points[:-1] if p[2]][-MAX_ANCHORS:]
        self.points = older + self.points[-1:]


def split_point(n_tokens: int, n_history: int, limit: int) -> int:
    """Where to cut a forward of `n_tokens` whose first `n_history` are settled history:
    after the re-fed ones (all of that history but its last token) when there are more
    than `limit` of them and new tokens follow; 0 = one call.  Without the cut a rejection
    in this pass would go back to the same checkpoint again, re-feeding more each round."""
    refed = n_history - 1
    return refed if refed > limit and n_history < n_tokens else 0


def landing(cache, checkpoints: Checkpoints, keep: int) -> int:
    """The position `roll_back(cache, checkpoints, keep)` reaches, changing nothing:
    `keep` where trimming is exact (attention layers, windows that have not wrapped),
    else the newest checkpoint's; 0 when a layer holds fewer positions than that (a
    forward interrupted half-way)."""
    layers = leaves(cache)
    if any(is_recurrent(c) or wrapped(c) for c in layers):
        pos, trimmed = checkpoints.newest_at(keep), [c for c in layers if not snapshotted(c)]
    else:
        pos, trimmed = keep, layers
    return 0 if any(c.offset < pos for c in trimmed) else pos


def roll_back(cache, checkpoints: Checkpoints, keep: int) -> int:
    """Roll every layer back to at most `keep` positions; return the position
    reached (`landing`): restored from a checkpoint where a layer cannot be trimmed
    back exactly (recurrent, a wrapped window), trimmed everywhere else."""
    pos, layers = landing(cache, checkpoints, keep), leaves(cache)
    if any(is_recurrent(c) or wrapped(c) for c in layers):
        checkpoints.restore(pos)
        trimmed = [c for c in layers if not snapshotted(c)]
    else:
        checkpoints.drop_after(pos)
        checkpoints.prune()
        trimmed = layers
    for c in trimmed:
        if c.offset > pos:
            c.trim(c.offset - pos)
    return pos
