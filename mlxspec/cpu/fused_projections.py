"""Sibling projections as one product: a layer's query, key and value projections,
and its MLP's gate and up projections, on the CPU backend's small-batch kernel.

A decode step calls the kernel once per projection: 7 calls per layer, 169 for
the default draft, each with a few MLX operations around it (a reshape, the
product, a slice, a bias) and the kernel's own start-up on two threads.  The
query, key and value projections read the same input, and so do gate and up:
their packed weights are stored side by side as one matrix, multiplied once, and
each projection's output is its slice of the columns.  The draft's 169 calls
become 97 and its step's MLX operations 2437 -> 2101 (measured here, interleaved
in one process, paired medians of 30-60 steps: a draft step 1.04x-1.05x faster, a
target step 1.01x-1.02x).

Each output column is summed exactly as before -- the kernel sums every column
over the inputs in one fixed order, whatever the other columns -- so the logits
are bit for bit those of the separate projections (tests/cpu/test_fused_projections.py),
for the draft and for the target, whose verify pass still scores each position
as a plain step does.

The model's own forward runs: the attention still calls `q_proj(x)`, `k_proj(x)`
and `v_proj(x)`.  `q_proj` computes the fused product and keeps it with its
input; `k_proj` and `v_proj` return their columns of it when they are called with
that same input (the same array object), and compute the product themselves
otherwise, so any call order gives the same result; the last of them lets go of
it (a prompt's product is large).  Only the attention classes of
`attention_classes` (which call all three on one input) and lean_ops.LeanMLP are
fused, and only packed projections of one format whose widths are whole column
blocks (their packed storage then concatenates).  MLXSPEC_FUSED=0 turns it off.
"""

from __future__ import annotations


import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import switches
from .packed_weights import NB, PackedLinear

ENV = "MLXSPEC_FUSED"  # "0": keep one product per projection


def attention_classes() -> tuple:
    """Attention modules whose forward calls q_proj, k_proj and v_proj on one input."""
    from mlx_lm.models import llama, qwen2, qwen3

    return (llama.Attention, qwen2.Attention, qwen3.Attention)


def wanted() -> bool:
    return switches.on(ENV)


def fuse(parts: list) -> PackedLinear | None:
    """One packed projection whose columns are those of `parts` in order, or None
    when they cannot be stored side by side (not packed, mixed formats or input
    widths, a width that is not whole column blocks)."""
    from .draft_weights import Int4Linear, Int8Linear

    first = parts[0]
    if not all(type(p) is type(first) and isinstance(p, PackedLinear) and p.fmt == first.fmt
               and p.in_dims == first.in_dims and p.out_dims % NB == 0 for p in parts):
        return None
    flat = np.concatenate([np.asarray(memoryview(p.packed)).reshape(-1) for p in parts])
    n = sum(p.out_dims for p in parts)
    packed = mx.array(flat.reshape(first.packed.shape[0], sum(p.packed.shape[1] for p in parts)))
    biases = [p["bias"] if "bias" in p else None for p in parts]
    bias = None if all(b is None for b in biases) else mx.concatenate(
        [b if b is not None else mx.zeros((p.out_dims,), dtype=mx.float32) for b, p in zip(biases, parts)])
    if isinstance(first, Int4Linear):  # each column block holds its own scales
        return Int4Linear(packed, first.in_dims, n, bias)
    if isinstance(first, Int8Linear):
        return Int8Linear(packed, mx.concatenate([p.scales for p in parts]), first.in_dims, n, bias)
    return PackedLinear(packed, first.in_dims, n, first.fmt, bias)


class _Last:
    """The fused product's last (input, output), set and read as one tuple (a thread
    that reads it mid-way through another's forward gets one or the other, whole),
    and the projection that computes it.  A plain object: not a module child."""

    def __init__(self, lead: "FusedFirst"):
        self.lead, self.pair = lead, (None, None)


class FusedFirst(nn.Module):
    """The first projection of a fused group: computes every column, returns its own."""

    def __init__(self, fused: PackedLinear, width: int):
        super().__init__()
        self.fused, self.width = fused, width
        self._last = _Last(self)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.fused(x)
        self._last.pair = (x, y)
        return y[..., :self.width]


class FusedPart(nn.Module):
    """A later projection of a fused group: its columns of the product the first one
    computed for this same input, or of a product of its own."""

    def __init__(self, first: FusedFirst, lo: int, hi: int, last: bool = False):
        """`last`: the group's last projection, which lets go of the kept product."""
        super().__init__()
        self._last, self.lo, self.hi, self.last = first._last, lo, hi, last

    def __call__(self, x: mx.array) -> mx.array:
        seen, y = self._last.pair
        if seen is not x:
            y = self._last.lead.fused(x)
        elif self.last:
            self._last.pair = (None, None)
        return y[..., self.lo:self.hi]


def fuse_attention(model: nn.Module, path: str, attn: nn.Module) -> bool:
    """Fuse the projections of the attention module `attn` at `path` of `model`."""
    from ..arch.surgery import put_module

    parts = [attn.q_proj, attn.k_proj, attn.v_proj]
    fused = fuse(parts)
    if fused is None:
        return False
    q, k, v = (p.out_dims for p in parts)
    first = FusedFirst(fused, q)
    for name, new in (("q_proj", first), ("k_proj", FusedPart(first, q, q + k)),
                      ("v_proj", FusedPart(first, q + k, q + k + v, last=True))):
        put_module(model, f"{path}.{name}", new)
    return True


def prepare(model: nn.Module) -> dict[str, int]:
    """Fuse `model`'s query/key/value and gate/up projections where they are packed
    (run after packed_weights, draft_weights and lean_ops); how many of each."""
    from ..arch.surgery import put_module
    from .layers import LeanMLP

    counts: dict[str, int] = {}
    if not wanted():
        return counts
    kinds = attention_classes()
    for path, m in list(model.named_modules()):
        if type(m) in kinds and fuse_attention(model, path, m):
            counts["attention"] = counts.get("attention", 0) + 1
        elif type(m) is LeanMLP and "gate_up" not in m:
            fused = fuse([m.gate_proj, m.up_proj])
            if fused is not None and fused.out_dims == 2 * m.gate_proj.out_dims:  # LeanMLP splits it in halves
                put_module(model, path, LeanMLP.fused(fused, m.down_proj))
                counts["mlp"] = counts.get("mlp", 0) + 1
    return counts
