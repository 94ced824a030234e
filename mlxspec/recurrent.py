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
  them);
* a draft model steps one token per forward, so it has a checkpoint at every
  position it may be rolled back to and never re-feeds.

Mixed lists (some layers attention, some recurrent; `CacheList` nests both) are
handled leaf by leaf.  `rollback_problem` names what cannot be rolled back
exactly (a cache kind that neither trims nor is a plain array state).
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache, CacheList

MAX_ANCHORS = 2  # older checkpoints kept where a prefill ended (a new turn, a regenerated reply)


def leaves(cache) -> list:
    """The per-layer caches, with `CacheList`s flattened."""
    out = []
    for c in cache:
        out.extend(leaves(c.caches) if isinstance(c, CacheList) else [c])
    return out


def is_recurrent(c) -> bool:
    return isinstance(c, ArraysCache)


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
                  if not is_recurrent(c) and not (hasattr(c, "trim") and hasattr(c, "offset") and c.is_trimmable())})
    if bad:
        return f"its {', '.join(bad)} layers can neither be trimmed nor snapshotted"
    return None


def cached_positions(cache) -> int:
    """The most positions any attention layer holds (0 for a recurrent-only model)."""
    return max((c.offset for c in leaves(cache) if not is_recurrent(c)), default=0)


class Checkpoints:
    """Snapshots of the recurrent layers' states, by position (sorted)."""

    def __init__(self, cache):
        self.layers = [c for c in leaves(cache) if is_recurrent(c)]
        self.points: list[tuple[int, list, bool]] = []  # (position, states, anchor)

    def __bool__(self) -> bool:
        return bool(self.layers)

    def record(self, position: int, anchor: bool = False) -> None:
        while self.points and self.points[-1][0] >= position:
            self.points.pop()
        self.points.append((position, [list(c.cache) for c in self.layers], anchor))

    def mark(self) -> int:
        return len(self.points)

    def thin(self, mark: int) -> None:
        """Keep only the newest of the checkpoints recorded since `mark` (a long
        prefill keeps one state, not one per chunk), and make it an anchor."""
        if len(self.points) > mark:
            pos, states, _ = self.points[-1]
            del self.points[mark:]
            self.points.append((pos, states, True))

    def restore(self, keep: int) -> int:
        """Put the recurrent layers back to the newest checkpoint at or before `keep`
        (none: their empty start state); return its position.  Older checkpoints are
        dropped but for the last few anchors, so memory stays a few states."""
        while self.points and self.points[-1][0] > keep:
            self.points.pop()
        if self.points:
            pos, states, _ = self.points[-1]
        else:
            pos, states = 0, [[None] * len(c.cache) for c in self.layers]
        for c, s in zip(self.layers, states):
            c.cache = list(s)
            c.lengths = c.left_padding = None
        self.prune()
        return pos

    def prune(self) -> None:
        """Keep the newest checkpoint and the last few anchors: a state per round
        in flight, not one per token generated."""
        older = [p for p in self.points[:-1] if p[2]][-MAX_ANCHORS:]
        self.points = older + self.points[-1:]


def roll_back(cache, checkpoints: Checkpoints, keep: int) -> int:
    """Roll every layer back to at most `keep` positions; return the position
    reached (= keep without recurrent layers; else the checkpoint's).  A layer
    holding fewer positions than that (a forward interrupted half-way) sends
    every layer back to the start."""
    pos = checkpoints.restore(keep) if checkpoints else keep
    attention = [c for c in leaves(cache) if not is_recurrent(c)]
    if any(c.offset < pos for c in attention):
        return roll_back(cache, checkpoints, 0) if pos else 0
    for c in attention:
        if c.offset > pos:
            c.trim(c.offset - pos)
    return pos
