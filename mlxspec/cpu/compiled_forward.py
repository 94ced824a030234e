"""The draft model's forwards as one compiled MLX function (CPU backend).

A draft step of the default draft is ~2400 MLX operations around its 169 matrix
products.  Building that graph in Python and dispatching its small operations
one by one cost about a sixth of the step: measured here, one process, 60
steps each, interleaved, medians, 29.9 ms uncompiled against 24.4 ms compiled
(the products alone take ~12 ms); `mx.compile` replays a traced graph without
Python and fuses its element-wise runs.

A compiled function must not depend on Python values that change from call to
call, and an mlx-lm forward depends on two: the KV cache's offset (where the
new keys and values go, and which positions attention reads) and the RoPE
positions.  Here both are inputs of the function:

* each layer's cache is passed whole -- its allocated capacity (mlx-lm's
  `KVCache` grows in steps of 256 positions) -- the new keys and values are
  written at `at` (an array) with `slice_update`, and attention reads every
  allocated position under a mask (an input) that admits the committed prefix
  and, in the new block, what the caller admits: the positions before each one
  (a causal call) or a tree node's ancestors (trees/attention.py);
* the RoPE tables (lean_ops.RopeTables: the cosines and sines of the positions)
  are given to every layer's `LeanRope` while the function is traced, so any
  positions -- consecutive, or a tree's depths -- come in as arrays.

The model's own forward runs (its layers call the stand-in caches below as they
call a `KVCache`): no architecture is re-implemented.  mx.compile keeps one
trace per shape (positions, capacity); a model whose computation changes (a
pruned head widened by a conversation's tokens is a new view) gets a function
of its own.
Masked positions get a softmax weight of exactly 0, so they add exact zeros to
the sums; tests check the logits against the uncompiled call.

Only the draft model uses it: a draft only proposes -- the target's verify
pass and the acceptance rule decide every token -- so the output is the
target's whatever the draft computes; the target keeps the uncompiled call,
whose verify pass scores each position bit for bit as a plain step does.
Used only where lean layers are (CPU backend, every layer's RoPE a LeanRope),
for model types tree attention is checked for, with full KV caches;
MLXSPEC_COMPILED_DRAFT=0 turns it off.

Threads: decoders of one pair share these functions (the table of them under a
lock); MLX 0.32 keeps each thread's traces apart, and the tables a trace is given
are seen by that thread only (lean_ops.RopeTables.giving).
"""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np

from ..arch import surgery
from . import switches
from ..arch.surgery import View

ENV = "MLXSPEC_COMPILED_DRAFT"  # "0": the draft's forwards run uncompiled
MAX_WIDTH = 33  # positions per compiled call (a tree's widest pass); wider calls (prefill) run uncompiled


class _Slot:
    """A layer's KVCache inside the trace: writes at `at`, returns every allocated
    position, and gives the model the caller's mask (mlx-lm asks cache[0])."""

    offset = 0  # read by the layers for RoPE; LeanRope uses the given tables instead

    def __init__(self, keys, values, at, mask):
        self.keys, self.values, self._at, self._mask = keys, values, at, mask

    def update_and_fetch(self, keys, values):
        self.keys = mx.slice_update(self.keys, keys, self._at, axes=(2,))
        self.values = mx.slice_update(self.values, values, self._at, axes=(2,))
        return self.keys, self.values

    def make_mask(self, *args, **kwargs):
        return self._mask


def _rope_tables(model):
    """The one RopeTables every layer's LeanRope shares, or None."""
    from .layers import LeanRope
    from ..arch.families import _layers, unwrapped

    layers = _layers(model) or []
    ropes = [unwrapped(getattr(getattr(layer, "self_attn", None), "rope", None)) for layer in layers]
    if not ropes or not all(type(r) is LeanRope for r in ropes):
        return None
    tables = {id(r._tables): r._tables for r in ropes}
    return next(iter(tables.values())) if len(tables) == 1 else None


def _head_dim(model) -> int | None:
    args = getattr(model, "args", None)
    if args is None:
        return None
    return getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads


def wanted() -> bool:
    """Not turned off, on the CPU backend (a calibration measured with compiled draft
    steps is another one)."""
    return switches.on(ENV)


def unusable(state) -> str | None:
    """None when `state`'s forwards can be compiled; else why not (one phrase)."""
    from ..arch.families import tree_support

    if not wanted():
        return f"{ENV}=0"
    if state.max_kv_size is not None or state.checkpoints:
        return "the cache is bounded or recurrent"
    why = tree_support(state.model)
    if why is not None:
        return why
    if _rope_tables(state.model) is None or _head_dim(state.model) is None:
        return "lean layers are off (Metal, or MLXSPEC_LEAN=0)"
    return None


def attach(state) -> bool:
    """Give `state` (a ModelState) compiled forwards where they can run."""
    state.compiled = CompiledForward(state) if unusable(state) is None else None
    return state.compiled is not None


KEPT = 4  # compiled functions kept in a process: the most recently used (model, cache capacity) pairs


def _identity(model) -> tuple:
    """What a forward of `model` computes: the model, or a view's base and overrides
    (every pruned head of one subset shares its rows, drafting/vocab_subset.py)."""
    if isinstance(model, View):
        d = model.__dict__
        return (id(d["_base"]),) + tuple(sorted((k, _identity(v) if isinstance(v, View) else id(v))
                                                for k, v in d.items() if k != "_base"))
    return (id(model),)


_functions: dict = {}  # (identity, capacity) -> (model, compiled function, RoPE tables, head dim), oldest first
_functions_lock = threading.Lock()  # decoders in several threads share the functions


def _function(model, capacity: int) -> tuple:
    """The compiled forward of `model` for caches of `capacity` positions.  mx.compile
    keeps a trace per shape of a function (~10 ms to trace, the first time a width is
    called), so functions are shared by every state of a model (a benchmark or a chat
    that builds decoders anew traces once) and one per capacity, the last KEPT only:
    a long conversation's caches keep growing, and each size's traces would stay."""
    # a module put in place since (int8 layers swapped by a benchmark) makes older traces stale
    key = (_identity(model), capacity, surgery.module_changes)
    with _functions_lock:
        entry = _functions.pop(key, None)
        if entry is None:
            entry = _new_function(model)
        _functions[key] = entry
        while len(_functions) > KEPT:
            del _functions[next(iter(_functions))]
    return entry


def _new_function(model) -> tuple:
    tables = _rope_tables(model)
    if tables is None:
        raise RuntimeError("compiled forward: the model's RoPE layers are not lean")

    def forward(x, cos, sin, at, mask, *kv):  # a new function: MLX keeps traces per function
        slots = [_Slot(kv[i], kv[i + 1], at, mask) for i in range(0, len(kv), 2)]
        with tables.giving(cos, sin):  # seen by this thread's trace only (lean_ops.RopeTables)
            logits = model(x, cache=slots)
        return [logits] + [a for s in slots for a in (s.keys, s.values)]

    return model, mx.compile(forward), tables, _head_dim(model)  # the model kept: its ids stay its own


class CompiledForward:
    """Compiled forwards for one ModelState (see the module docstring)."""

    def __init__(self, state):
        self.state = state

    def takes(self, n: int) -> bool:
        """Can a call over `n` positions run compiled now (the caches allocated: `attach`
        made sure they are full KV caches)?"""
        return 0 < n <= MAX_WIDTH and self.state.cache[0].keys is not None

    def _reserve(self, need: int) -> None:
        """Grow every cache to hold `need` positions, in whole steps of its allocation
        (KVCache.update_and_fetch would keep an odd capacity after a trim: each new
        capacity is a new trace)."""
        for c in self.state.cache:
            cap = c.keys.shape[2]
            if need <= cap:
                continue
            size = (need + c.step - 1) // c.step * c.step
            B, H, _, D = c.keys.shape
            c.keys = mx.concatenate([c.keys[..., :c.offset, :], mx.zeros((B, H, size - c.offset, D), c.keys.dtype)],
                                    axis=2)
            c.values = mx.concatenate([c.values[..., :c.offset, :],
                                       mx.zeros((B, H, size - c.offset, c.values.shape[3]), c.values.dtype)], axis=2)

    def __call__(self, x: mx.array, tree=None) -> mx.array:
        """Logits (n, V) for the n tokens `x`, appended at the cache's offset.
        `tree`: (positions, mask) of a tree block's nodes -- numpy, the RoPE position of
        each and (n, offset + n) booleans over the cached positions; None: a causal call."""
        cache = self.state.cache
        n, o = x.size, cache[0].offset
        self._reserve(o + n)
        cap = cache[0].keys.shape[2]
        _, fn, tables, d = _function(self.state.model, cap)
        mask = np.zeros((n, cap), dtype=bool)
        if tree is None:
            positions = np.arange(o, o + n)
            mask[:, :o] = True
            mask[:, o:o + n] = np.tril(np.ones((n, n), dtype=bool))
        else:
            positions, rows = tree
            mask[:, :rows.shape[1]] = rows
        cos, sin = tables.tables(("at", positions.tobytes()), positions, d)
        kv = [a for c in cache for a in (c.keys, c.values)]
        out = fn(x.reshape(1, -1), cos, sin, mx.array([o], dtype=mx.int32), mx.array(mask), *kv)
        for i, c in enumerate(cache):
            c.keys, c.values = out[1 + 2 * i], out[2 + 2 * i]
            c.offset = o + n
        return out[0][0]
