"""Element-wise and row-wise operations that MLX's x86 build computes slowly, done by
the small-batch kernel (cpu/small_gemm.c) on the CPU backend.

MLX 0.32's x86 build computes exp, sigmoid and everything made of them one element
at a time (~16 ns each).  A decode step meets them in the MLP's activation
(SwiGLU: 4 ms of a 90 ms target step, 20 ms of a 5-position verify pass), in the
attention's softmax (cpu/attention.py), and in normalising a row of logits
(2.4 ms per row of the default target's 151,936, per draft row 1 ms).  Here each
is one call into cpu/small_gemm.c, 16 lanes at a time:

* `swiglu(gate, up)`: silu(gate) * up with MLX's own exp and sigmoid algorithm,
  in MLX's operation order -- bit for bit mlx-lm's `swiglu`;
* `softmax(x)` and `log_softmax(x)` over the last axis: one row at a time
  (max, MLX's exp, a sum in a fixed order), so a row's result does not depend on
  the other rows of the call; they differ from MLX's by float32 rounding.

MLX has no custom CPU operations, so each reaches the kernel as an addmm marked
by its alpha (a bit pattern no real call uses; cpu/small_gemm.c's SWIGLU, SOFTMAX,
LOG_SOFTMAX), as packed weights do; a malformed marked call gives NaN.  Each
operation is checked once per process against MLX's (`usable`) and is used only
on the CPU backend with the kernel loaded and lean layers on (MLXSPEC_LEAN).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

BITS = {"swiglu": 0x7E5A3C10, "softmax": 0x7E5A3C11, "log_softmax": 0x7E5A3C12}  # cpu/small_gemm.c's marks
ELEMENTWISE_BIT = {"swiglu": 1, "softmax": 2, "log_softmax": 4}  # mlxspec_gemm_elementwise()
SWIGLU_WIDTH = 16  # cpu/small_gemm.c's SWIGLU_WIDTH: a SwiGLU call comes as a (rows, 16) product


def alpha(bits: int) -> float:
    """The float32 whose bit pattern is `bits` (an alpha that marks a kernel call)."""
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


ALPHA = {op: alpha(b) for op, b in BITS.items()}
_UNUSED_B = mx.zeros((SWIGLU_WIDTH, SWIGLU_WIDTH), dtype=mx.float32)  # a SwiGLU product's B: never read
_checked: dict[str, bool] = {}
OPERANDS_KEPT = 64  # row-wise calls' operand shapes kept (a long conversation's widths come and go)
BATCHED_MATRICES = 4  # a row-wise call over at most this many matrices goes unreshaped (one call each)
_OPERANDS: dict = {}


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up by the kernel (float32, same shapes, the last axis a multiple of
    SWIGLU_WIDTH): an addmm whose C holds `up`."""
    rows = gate.size // SWIGLU_WIDTH
    out = mx.addmm(up.reshape(rows, SWIGLU_WIDTH), gate.reshape(rows, SWIGLU_WIDTH), _UNUSED_B,
                   alpha=ALPHA["swiglu"], beta=1.0)
    return out.reshape(gate.shape)


def _operands(shape: tuple) -> tuple[mx.array, mx.array]:
    """A row-wise call's A (*shape[:-1], 1) and B (1, n), never read: made once per shape, so
    that a compiled forward takes them as constants instead of making them on every call."""
    out = []
    for key, made in ((shape[:-1] + (1,), shape[:-1] + (1,)), (("B", shape[-1]), (1, shape[-1]))):
        a = _OPERANDS.get(key)
        if a is None:  # held here: another thread's call may drop the oldest entry meanwhile
            if len(_OPERANDS) >= OPERANDS_KEPT:
                _OPERANDS.pop(next(iter(_OPERANDS), None), None)
            a = _OPERANDS[key] = mx.array(np.zeros(made, dtype=np.float32))
        out.append(a)
    return out[0], out[1]


def _rows(x: mx.array, op: str) -> mx.array:
    """A row-wise op over the last axis: addmm(x, zeros (..., rows, 1), zeros (1, n)), C holding x.
    A few matrices (attention's scores per key head) go as they are, one kernel call each:
    no reshapes around the call; more are made one (rows, n) matrix."""
    n = x.shape[-1]
    matrices = math.prod(x.shape[:-2]) if x.ndim >= 2 and x.shape[-2] > 0 else 0
    if 1 <= matrices <= BATCHED_MATRICES:
        return mx.addmm(x, *_operands(x.shape), alpha=ALPHA[op], beta=1.0)
    rows = x.size // n
    out = mx.addmm(x.reshape(rows, n), *_operands((rows, n)), alpha=ALPHA[op], beta=1.0)
    return out.reshape(x.shape)


def softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis (float32) by the kernel."""
    return _rows(x, "softmax")


def log_softmax(x: mx.array) -> mx.array:
    """x - logsumexp(x) over the last axis (float32) by the kernel."""
    return _rows(x, "log_softmax")


def _check(op: str) -> bool:
    from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

    rng = np.random.default_rng(0)
    if op == "swiglu":
        g = np.concatenate([rng.standard_normal(4 * 96) * s for s in (0.1, 3.0, 40.0)]).astype(np.float32)
        g[:8] = [0.0, -0.0, 88.0, -88.0, 89.0, -89.0, 1e-30, -1e-30]
        g, u = mx.array(g.reshape(3, 4, 96)), mx.array(rng.standard_normal((3, 4, 96)).astype(np.float32))
        return bool(np.array_equal(np.array(swiglu(g, u)), np.array(mlx_lm_swiglu(g, u))))
    x = (rng.standard_normal((3, 5, 37)) * [[[0.1]], [[5.0]], [[60.0]]]).astype(np.float32)
    x[1, :, 30:] = np.finfo(np.float32).min  # masked, as mlx-lm masks
    xs = mx.array(x)
    if op == "softmax":
        return bool(np.allclose(np.array(softmax(xs)), np.array(mx.softmax(xs, axis=-1, precise=True)),
                                rtol=1e-5, atol=1e-7))
    want = xs - mx.logsumexp(xs, axis=-1, keepdims=True)
    return bool(np.allclose(np.array(log_softmax(xs)), np.array(want), rtol=1e-5, atol=1e-4))


def usable(op: str) -> bool:
    """Can `op` run in the kernel here: the CPU backend with lean layers on, the kernel
    loaded and computing it as MLX does (checked once per process)?"""
    if op not in _checked:
        from . import kernel as small_gemm, switches

        _checked[op] = bool(switches.on(switches.LAYERS) and small_gemm.elementwise() & ELEMENTWISE_BIT[op]) and _check(op)
    return _checked[op]


def _takes(x: mx.array, op: str) -> bool:
    """Can the kernel's row-wise `op` take `x` (float32 rows, the kernel usable here)?"""
    return x.dtype == mx.float32 and x.ndim >= 1 and x.shape[-1] > 0 and usable(op)


def probabilities(logprobs: mx.array) -> mx.array:
    """exp(logprobs) for rows already normalised (sampling.process_logits): their softmax by
    the kernel where it is usable -- the same to float32 rounding, where MLX's exp took
    1.8-2.3 ms a row of the default target's 151,936 (a sampled tree round exponentiates a
    row per node, the draft's and the target's)."""
    if _takes(logprobs, "softmax"):
        return softmax(logprobs)
    return mx.exp(logprobs)


def normalise(logits: mx.array) -> mx.array:
    """logits - logsumexp(logits) over the last axis: in the kernel where it is usable."""
    if _takes(logits, "log_softmax"):
        return log_softmax(logits)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)
