"""Weights laid out for BLAS on the CPU backend: every float32 linear layer keeps
its weight transposed, (in, out) row-major, so a matmul is `x @ Wt` with no
transpose flag.

mlx-lm stores a linear layer's weight as (out, in) and computes `x @ W.T`; on
the CPU backend that reaches `cblas_sgemm` with the weight transposed, and
OpenBLAS (0.3.21, Debian's) then packs the weight with a strided copy on every
call.  The packing is what a decode step mostly waits for: with the weight
stored (in, out) the same product takes the contiguous path.  Measured here on
the default pair (2 x86 cores, OpenBLAS, float32, interleaved in one process,
`benchmarks/blas_layout.py`): a plain decode step 0.84 s -> 0.52 s; the logits
are bit-identical, since the kernel sums in the same order.

Only the storage changes: `TransposedLinear` is called where the model calls
its `nn.Linear` (the model's own forward runs, no architecture is
re-implemented), and `.weight` still reads as (out, in) for code that inspects
it.  Quantised layers, other dtypes and the GPU backends (where MLX's own
kernels prefer (out, in)) keep mlx-lm's layout.  MLXSPEC_BLAS_LAYOUT=0 turns it
off (for comparisons).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..arch.surgery import module_at, put_module
from . import switches

ENV_OFF = "MLXSPEC_BLAS_LAYOUT"  # "0": keep mlx-lm's (out, in) layout


class TransposedLinear(nn.Module):
    """An `nn.Linear` whose weight is stored transposed, (in, out) contiguous."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.wt = mx.contiguous(linear.weight.T)
        if "bias" in linear:
            self.bias = linear.bias

    @property
    def weight(self) -> mx.array:
        """The weight as mlx-lm lays it out, (out, in): a view, for code that inspects it."""
        return self.wt.T

    def __call__(self, x: mx.array) -> mx.array:
        return mx.addmm(self["bias"], x, self.wt) if "bias" in self else x @ self.wt


def wanted() -> bool:
    """Does this process lay weights out for BLAS (the CPU backend, not turned off)?"""
    return switches.on(ENV_OFF)


def prepare(model: nn.Module) -> int:
    """Store every float32 `nn.Linear` of `model` transposed (when `wanted()`); the
    number of layers changed.  One layer at a time, so memory never holds more than
    one extra weight."""
    if not wanted():
        return 0
    todo = [path for path, m in model.named_modules()
            if type(m) is nn.Linear and m.weight.dtype == mx.float32]
    for path in todo:
        new = TransposedLinear(module_at(model, path))
        mx.eval(new.wt)
        put_module(model, path, new)
    return len(todo)


def transposed(model) -> bool:
    """Did `prepare` change `model`?"""
    return model is not None and any(isinstance(m, TransposedLinear) for _, m in model.named_modules())
