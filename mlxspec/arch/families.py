"""mlx-lm model classes as mlxspec knows them: which can take a token tree, and
the one change tree verification makes to them.

A tree block needs each row rotated by its own position: `install_ropes` wraps
every attention layer's RoPE once, in a `TreeRope` that reads this thread's tree
positions from a context variable (set by trees/attention.py for the duration of
one call) and otherwise calls the RoPE unchanged.  So no shared model object is
patched per call, and threads sharing a model never see each other's positions.
"""

from __future__ import annotations

import contextvars
import threading

import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

# Model types whose layers build the mask from cache[0] and call `self_attn.rope(x, offset=...)`
# on a plain KVCache; tests/test_tree_attention.py checks each against chain forwards.
TREE_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def _layers(model):
    layers = getattr(model, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "model", None), "layers", None)
    return layers


def tree_support(model) -> str | None:
    """None when `model` can take a tree block; else why not (one phrase)."""
    kind = getattr(model, "model_type", None)
    if kind not in TREE_MODEL_TYPES:
        return f"model type {kind!r} is not one tree attention is checked for ({', '.join(TREE_MODEL_TYPES)})"
    layers = _layers(model)
    if not layers or not all(hasattr(getattr(layer, "self_attn", None), "rope") for layer in layers):
        return f"model type {kind!r} has layers without self_attn.rope"
    if any(type(c) is not KVCache for c in make_prompt_cache(model)):
        return f"model type {kind!r} uses caches other than a full KV cache (sliding window or recurrent state)"
    return None


_POSITIONS: contextvars.ContextVar = contextvars.ContextVar("mlxspec_tree_positions", default=None)
_INSTALL = threading.Lock()


class TreeRope(nn.Module):
    """A layer's RoPE, put in place once (`install_ropes`): while this thread's tree
    call has set positions (`_POSITIONS`), row i of the block is rotated by
    `positions[i]`; otherwise it is the RoPE itself, called unchanged."""

    def __init__(self, rope):
        super().__init__()
        self.inner = rope

    def __call__(self, x, offset=0):
        positions = _POSITIONS.get()
        if positions is None:
            return self.inner(x, offset=offset)
        # (1, H, L, D) -> (L, H, 1, D): mx.fast.rope takes one offset per batch row
        return self.inner(x.transpose(2, 1, 0, 3), offset=positions).transpose(2, 1, 0, 3)


def unwrapped(rope):
    """The RoPE a `TreeRope` stands for (any other module as it is)."""
    return rope.inner if isinstance(rope, TreeRope) else rope


def install_ropes(model) -> list:
    """Every attention layer of `model` with its RoPE wrapped in a TreeRope, once: the
    wrapper calls the RoPE unchanged outside tree calls, so putting it in place while
    another thread runs the model changes nothing that thread computes.  The layers'
    attention modules."""
    attns = [layer.self_attn for layer in _layers(model)]
    if not all(isinstance(a.rope, TreeRope) for a in attns):
        with _INSTALL:
            for a in attns:
                if not isinstance(a.rope, TreeRope):
                    a.rope = TreeRope(a.rope)
    return attns
