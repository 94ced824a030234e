"""One forward pass over a token tree, on mlx-lm's own model classes.

A tree of candidate tokens is fed as one block of positions after a model's
committed tokens.  Two things make the block a tree instead of a sequence:

* the attention mask: each node sees the committed prefix, its ancestors in the
  block and itself -- never its siblings or their subtrees;
* the positions used by RoPE: a node's position is the prefix length plus its
  depth - 1, whatever its place in the block.

Both are passed through the model's own code, not a re-implementation, and
both travel with the call, never on the shared model (a loaded pair serves
several threads at once, tests/test_threads.py): the first of the call's own
caches -- the ModelState's, no other call's -- returns the tree mask from
`make_mask` (mlx-lm models build their mask from `cache[0]`), and the nodes'
positions are set in a context variable, seen only by this thread's call, that
each attention layer's `TreeRope` reads: a wrapper put around the layer's RoPE
once per model (`install_ropes`, idempotent, under a lock), which rotates by the
positions while they are set (the block moved to the batch axis, where
`mx.fast.rope` takes one offset per row) and otherwise calls the RoPE unchanged.
Only model types checked by the tests (the logits of every node equal those of a
chain forward of its root-to-node path) are in `TREE_MODEL_TYPES`; other models
verify chains, and `tree_support` says why.

A block's positions stay in the KV cache but not in `ModelState.tokens` until
`commit(path)` gathers the accepted path's keys and values into place and
trims the rest; a block never committed (an exception mid-round) is dropped by
the next `sync`, like any position the token list does not name.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..arch.families import _POSITIONS, TREE_MODEL_TYPES, _layers, install_ropes, tree_support  # noqa: F401 (re-exported)
from ..core.cache import ModelState

class TreeBlock:
    """The uncommitted tree positions fed to one ModelState, possibly over several
    forwards (a draft expanding its tree level by level)."""

    def __new__(cls, state: ModelState):
        """A state may name the TreeBlock subclass its blocks are (`state.tree_block`: distributed/mirror.py)."""
        own = getattr(state, "tree_block", None)
        return super().__new__(own if cls is TreeBlock and own is not None else cls)

    def __init__(self, state: ModelState):
        """`state` right after its `sync`: its cache holds exactly its tokens."""
        if state.fed != len(state.tokens):
            raise ValueError("a tree block starts right after sync(): the cache holds unnamed positions")
        self.state = state
        self.base = len(state.tokens)  # committed positions
        self.tokens: list[int] = []
        self.parents: list[int] = []  # block index of each node's parent; -1: the committed prefix
        self.depth: list[int] = []
        self.ancestors: list[int] = []  # bitsets over block indices (self included)
        self.chain = True  # every node so far is its predecessor's child (the first the prefix's)

    def __len__(self):
        return len(self.tokens)

    def forward(self, tokens: list[int], parents: list[int], width: int | None = None) -> mx.array:
        """Logits (len(tokens), V) for new nodes; `parents` index the block (earlier
        nodes, or nodes earlier in this call), -1 for the committed prefix.
        `width`: run the call over that many positions, padded with nodes no other
        node sees (a wider pass can cost less, cost_model.CostModel.pad_width); they
        take block indices after these nodes and are never committed.  While the
        block is one chain from the prefix (a draft's root forward with lookup's
        spine, a level that feeds one node), the model's own causal call computes
        exactly the tree call's result at less cost (`_causal`)."""
        n = len(tokens)
        pad = max(0, (width or 0) - n)
        if pad:
            tokens = list(tokens) + [tokens[-1]] * pad
            parents = list(parents) + [-1] * pad
        first = len(self.tokens)
        for t, p in zip(tokens, parents):
            if not -1 <= p < len(self.tokens):
                raise ValueError(f"parent {p} is not an earlier node of the block")
            i = len(self.tokens)
            self.chain = self.chain and p == i - 1
            self.tokens.append(t)
            self.parents.append(p)
            self.depth.append(1 + (self.depth[p] if p >= 0 else 0))
            self.ancestors.append((self.ancestors[p] if p >= 0 else 0) | (1 << i))
        x = mx.array(tokens, dtype=mx.uint32)
        if self.chain:
            logits = self._causal(x)
        else:
            positions = np.array([self.base + d - 1 for d in self.depth[first:]], dtype=np.int32)
            mask = self._mask(first)
            if self.state.compiled is not None and self.state.compiled.takes(x.size):
                logits = self.state._call(x, (positions, mask))  # cpu/compiled_forward.py: mask and positions are inputs
            else:
                logits = self._call(x, mx.array(mask), mx.array(positions))
        return logits[:n] if pad else logits

    def _mask(self, first: int) -> np.ndarray:
        """Rows for block nodes `first`.. : the committed prefix, and each node's ancestors and itself."""
        total = len(self.tokens)
        bits = np.array([[(a >> j) & 1 for j in range(total)] for a in self.ancestors[first:]], dtype=bool)
        return np.concatenate([np.ones((total - first, self.base), dtype=bool), bits], axis=1)

    def _causal(self, x):
        """The block so far is one chain from the prefix: each node's ancestors are
        exactly the block positions before it and its RoPE position is its cache
        offset, so the model's own causal call is the tree call (tests check both
        against chain forwards of each path): the state's own call (trees need full KV
        caches, so it records no checkpoint)."""
        return self.state._call(x)

    def _call(self, x, mask, positions):
        """The model's own forward over the block: the mask from this state's own first
        cache (no other call's), the positions in this thread's context only."""
        state = self.state
        install_ropes(state.model)
        own = state.cache[0]
        state.fed += x.size  # first: an interrupted call is rolled back by the next sync
        token = _POSITIONS.set(positions)
        try:
            own.make_mask = lambda *args, **kwargs: mask
            logits = state.model(x.reshape(1, -1), cache=state.cache)[0]
        finally:
            _POSITIONS.reset(token)
            own.__dict__.pop("make_mask", None)
        state.positions += x.size
        if state.widths is not None:
            state.widths.append(x.size)
        return logits

    def commit(self, path: list[int]) -> None:
        """Keep the block nodes `path` (a root-to-node chain, each the parent of the
        next) as the next committed tokens; drop every other block position."""
        for i, j in enumerate(path):
            if self.parents[j] != (path[i - 1] if i else -1):
                raise ValueError(f"block path {path} is not a chain from the prefix")
        base, n = self.base, len(path)
        if path != list(range(n)):
            rows = mx.array([base + j for j in path], dtype=mx.int32)
            for c in self.state.cache:
                if isinstance(c.keys, (tuple, list)):  # a QuantizedKVCache: (packed, scales, biases), each per position
                    for a in (*c.keys, *c.values):
                        a[..., base: base + n, :] = mx.take(a, rows, axis=2)
                else:
                    c.keys[..., base: base + n, :] = mx.take(c.keys, rows, axis=2)
                    c.values[..., base: base + n, :] = mx.take(c.values, rows, axis=2)
        for c in self.state.cache:
            c.offset = base + n
        self.state.tokens.extend(self.tokens[j] for j in path)
        self.state.fed = base + n
        self.tokens, self.parents, self.depth, self.ancestors = [], [], [], []
        self.chain = True
        self.base += n
