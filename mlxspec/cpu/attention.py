"""Attention with its softmax in the small-batch kernel, on the CPU backend.

MLX 0.32's x86 build computes exp one element at a time (~16 ns each), and the
softmax of attention takes one exp per score: with the default target, 1-4 ms
of a plain step and 9-40 ms of a 5-9 position verify pass over 300-1000 cached
tokens.  `lean_attention` computes what mlx-lm's `scaled_dot_product_attention`
computes, in the steps MLX's CPU fallback takes -- scores by matmul (one product
of the block's rows per query head, so the small-batch kernel scores each
position as a plain step would), the mask, a softmax, a matmul by the values --
with the softmax in cpu/small_gemm.c: one row at a time (max, MLX's exp, a sum in a
fixed order; cpu/kernel_ops.py), so a row's result does not depend on the other
rows of the call.  It differs from MLX's softmax by float32 rounding (checked
once per process; without the kernel nothing changes).

mlx-lm's model modules call
their module-level `scaled_dot_product_attention`: `install` points the
registered modules (`attention_modules`) at `lean_attention`, process-wide, on
the CPU backend only; `lean_attention` passes anything it does not take
(attention sinks, quantized caches, other dtypes, or `set_attention(False)`) to
mlx-lm's own.  MLXSPEC_LEAN=0 turns it off with the other lean layers.
"""

from __future__ import annotations

import sys

import mlx.core as mx
from mlx_lm.models import base

from . import kernel_ops, kernel as small_gemm


_attention = {"on": True}


def lean_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's `scaled_dot_product_attention`, as MLX's CPU backend computes it
    (scores by matmul, the mask, a softmax, a matmul by the values), with the softmax
    in the kernel: float32 only, and only while `set_attention` has it on; otherwise
    (sinks, a quantized cache, other dtypes) mlx-lm's own."""
    if not _attention["on"] or sinks is not None or hasattr(cache, "bits") or \
            queries.dtype != mx.float32 or keys.dtype != mx.float32 or values.dtype != mx.float32:
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask,
                                                 sinks=sinks)
    B, n_q, L, D = queries.shape
    n_kv, T = keys.shape[-3], keys.shape[-2]
    rep = n_q // n_kv
    if isinstance(mask, str):  # "causal"
        mask = mx.arange(T - L, T)[:, None] >= mx.arange(T)[None]
    g = heads_per_product(rep, L) if mask is None or mask.ndim <= 2 else 1
    q = queries * scale
    if rep > 1 and g == rep:  # all query heads of a key head in one product (g * L rows): the same products,
        q = q.reshape(B, n_kv, g * L, D)  # without a batch axis of one (fewer operations to replay, compiled)
    elif rep > 1:  # the query heads sharing a key head: g of them (g * L rows) scored by one product
        q = q.reshape(B, n_kv, rep // g, g * L, D)
        keys, values = mx.expand_dims(keys, -3), mx.expand_dims(values, -3)
    scores = q @ mx.swapaxes(keys, -1, -2)
    if mask is not None:
        if g > 1 and L > 1:  # each head's L rows under the same (L, T) mask (one row: it broadcasts as it is)
            scores = scores.reshape(*q.shape[:-2], g, L, T)
        elif rep > 1 and mask.ndim > 3:
            mask = mx.expand_dims(mask, -3)
        scores = mx.where(mask, scores, mx.finfo(mx.float32).min) if mask.dtype == mx.bool_ else scores + mask
    probs = kernel_ops.softmax(scores)
    out = (probs.reshape(*q.shape[:-1], T) if probs.ndim != q.ndim else probs) @ values
    return out.reshape(B, n_q, L, out.shape[-1]) if rep > 1 else out


def heads_per_product(rep: int, L: int) -> int:
    """How many of the `rep` query heads sharing a key head one product scores together
    (their L rows each stacked): the most, a divisor of `rep`, whose rows the kernel's
    small products still take.  There each score is one dot product and each output one
    sum in a fixed order, whatever the other rows, so grouping heads changes no bit -- and
    reads the keys and values once instead of once per head.  1 when the kernel does not
    take the products (another BLAS's sums may depend on the shape)."""
    limit = small_gemm.max_rows() if rep > 1 and small_gemm.enabled() else 0
    for g in range(rep, 1, -1):
        if rep % g == 0 and g * L <= limit:
            return g
    return 1


def attention_modules() -> tuple:
    """mlx-lm model modules whose attention calls their module's `scaled_dot_product_attention`
    (imported from models.base); tests/cpu/test_layers.py checks each model type."""
    from mlx_lm.models import llama, qwen2, qwen3

    return (llama, qwen2, qwen3)


def applies_to(model) -> bool:
    mod = sys.modules.get(type(model).__module__)
    return _attention["on"] and mod is not None and getattr(mod, "scaled_dot_product_attention", None) is \
        lean_attention


def set_attention(on: bool) -> bool:
    """Lean attention on or off in this process (benchmarks compare both); the old setting."""
    old, _attention["on"] = _attention["on"], bool(on)
    return old


def install(model) -> bool:
    """When `model`'s type is registered: point the registered model modules' attention
    at `lean_attention` (process-wide: every model of those types on this backend);
    False when it is not or the kernel cannot."""
    if sys.modules.get(type(model).__module__) not in attention_modules() or not kernel_ops.usable("softmax"):
        return False
    for mod in attention_modules():
        if mod.scaled_dot_product_attention is base.scaled_dot_product_attention:
            mod.scaled_dot_product_attention = lean_attention
    return True
