"""Fewer and cheaper MLX operations per layer on the CPU backend: RoPE from tables
shared by every layer, RMSNorm compiled, SwiGLU in the small-batch kernel.

On the CPU backend MLX has no kernels of its own for `mx.fast.rope` and
`mx.fast.rms_norm`: each call is built from ~20 and ~7 primitive operations
(the RoPE frequencies are recomputed, with exp, cos and sin, in every layer,
for the queries and again for the keys).  A decode step of the default draft
was 3421 operations, of which 168 are the matmuls that move the weights; each
costs a few microseconds of scheduling on the main thread and of work on MLX's
stream thread, which on two cores compete with the matmul kernel's threads.
Lean, the step is 2069 operations.  Measured here, one process, interleaved
step by step (40 each, a noisy day), median of the paired ratios: a draft pass
over 1 / 5 / 9 positions 1.08x / 1.00x / 1.05x faster, a target pass 1.06x /
1.05x / 1.03x (`benchmarks/lean_ops.py` runs whole generations).

* `LeanRope` replaces an `nn.RoPE` (the class mlx-lm's `initialize_rope` gives
  when there is no scaling config): x * C + partner(x) * S, where C and S are
  the cosines and sines of the positions (computed once per forward, in float64
  on the host, and shared by all layers and by queries and keys) and partner(x)
  each feature's rotation partner, signed.  All of it is element-wise: a
  position's result does not depend on how many positions the call holds (a
  verify pass scores each position as a plain step does).
* `LeanRMSNorm` replaces an `nn.RMSNorm` with the same arithmetic in one
  compiled function (two fused kernels and a reduction per call).
* `LeanMLP` replaces a SwiGLU MLP of the model types in `_swiglu_mlps` (their
  forward is `down_proj(swiglu(gate_proj(x), up_proj(x)))`, with the model's own
  projections): MLX 0.32's x86 build computes exp and sigmoid one element at a
  time (~16 ns each: 4 ms of a 90 ms target step, 20 ms of a 5-position verify
  pass), so the activation runs in cpu/small_gemm.c instead, 16 lanes at a time
  with MLX's own algorithm and operation order -- bit for bit mlx-lm's result
  (cpu/kernel_ops.py checks it once per process; no MLP is replaced when it does
  not hold or the kernel is not loaded).

The model's own forward runs: these modules are called where it calls its RoPE
and norms; no architecture is re-implemented.  The results differ from MLX's
fallbacks by float32 rounding only (the tests bound it) -- what decoding,
speculation and trees compute is the same model everywhere in a process.  Only
the CPU backend is changed (Metal has real kernels for both);
MLXSPEC_LEAN=0 turns it off.
"""

from __future__ import annotations

import contextlib
import threading

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.activations import swiglu

from . import kernel_ops, switches, attention as lean_attention

ENV = switches.LAYERS


def wanted() -> bool:
    """Does this process slim layers (the CPU backend, not turned off)?"""
    return switches.on(ENV)


class RopeTables:
    """Cosines and sines of one RoPE's frequencies for the positions of the current
    forward, computed once and reused by every layer that asks for the same positions.
    A model shared by threads shares its tables: the last tables made are kept as one
    (key, value) pair, replaced whole, and `given` is each thread's own."""

    def __init__(self, dims: int, base: float, scale: float, traditional: bool):
        self.dims, self.traditional = dims, traditional
        self.inv_freq = scale * base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
        self._last = (None, None)  # (key, (C, S)): read and replaced as one
        self._local = threading.local()  # .given: (C, S) while this thread traces a compiled forward
        self._partners = None  # partner_matrix's P, made once

    @property
    def given(self):
        """(C, S) while this thread traces a compiled forward (cpu/compiled_forward.py), else None."""
        return getattr(self._local, "given", None)

    @contextlib.contextmanager
    def giving(self, cos: mx.array, sin: mx.array):
        """While open, every LeanRope of these tables rotates by `cos` and `sin`
        ((positions, d) arrays: a compiled forward's inputs), whatever its offset."""
        self._local.given = (cos, sin)
        try:
            yield
        finally:
            self._local.given = None

    def partner_matrix(self, d: int) -> mx.array:
        """P (d, d) with x @ P == _partners(x): one signed 1 per column, so each output is
        one of x's values exactly (the other terms are exact zeros; a zero partner may come
        out +0 where the slices give -0).  A compiled forward replays one product instead of
        _partners' two slices, negation and concatenation."""
        p = self._partners
        if p is None or p.shape[0] != d:
            p = self._partners = mx.array(np.array(_partners(mx.array(np.eye(d, dtype=np.float32)), self.dims,
                                                             self.traditional)))
        return p

    def tables(self, key, positions: np.ndarray, d: int) -> tuple[mx.array, mx.array]:
        """(C, S), each (len(positions), d): cos / sin per rotated feature, 1 / 0 after `dims`."""
        last_key, value = self._last
        if key != last_key:
            angles = positions.astype(np.float64)[:, None] * self.inv_freq[None]
            cos, sin = np.cos(angles), np.sin(angles)
            n = len(positions)
            c, s = np.ones((n, d), dtype=np.float32), np.zeros((n, d), dtype=np.float32)
            if self.traditional:
                c[:, 0:self.dims:2], c[:, 1:self.dims:2] = cos, cos
                s[:, 0:self.dims:2], s[:, 1:self.dims:2] = sin, sin
            else:
                h = self.dims // 2
                c[:, :h], c[:, h:self.dims] = cos, cos
                s[:, :h], s[:, h:self.dims] = sin, sin
            value = (mx.array(c), mx.array(s))
            self._last = (key, value)
        return value


class LeanRope(nn.Module):
    """An `nn.RoPE` computed from shared tables (see the module docstring).  Called
    as mlx-lm calls a RoPE: `offset` an int (positions offset.. along axis -2) or an
    array of one offset per batch row (as `mx.fast.rope` takes it)."""

    def __init__(self, rope: nn.RoPE, tables: RopeTables):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = rope.dims, rope.traditional, rope.base, rope.scale
        self._tables = tables

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        t = self._tables
        if t.given is not None:  # a compiled forward: the partners by one product (fewer operations to replay)
            c, s = t.given
            return x * c + (x @ t.partner_matrix(x.shape[-1])) * s
        if x.dtype != mx.float32:  # the tables are float32: other dtypes keep MLX's own RoPE
            return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale,
                                offset=offset)
        d, n = x.shape[-1], x.shape[-2]
        if isinstance(offset, mx.array) and offset.ndim == 1:  # one offset per batch row
            first = np.array(offset, dtype=np.int64)
            positions = (first[:, None] + np.arange(n)[None]).reshape(-1)
            c, s = t.tables(("rows", first.tobytes(), n), positions, d)
            shape = (len(first),) + (1,) * (x.ndim - 3) + (n, d)
        else:
            start = int(offset.item()) if isinstance(offset, mx.array) else int(offset)
            c, s = t.tables(("from", start, n), np.arange(start, start + n), d)
            shape = (n, d)
        return x * c.reshape(shape) + _partners(x, self.dims, self.traditional) * s.reshape(shape)


def _partners(x: mx.array, dims: int, traditional: bool) -> mx.array:
    """Each rotated feature's partner, signed: (-x2, x1) per pair; the features after
    `dims` are multiplied by a sine of 0, so what stands there does not matter."""
    if traditional:
        pairs = x[..., :dims].reshape(*x.shape[:-1], dims // 2, 2)
        out = mx.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(*x.shape[:-1], dims)
    else:
        h = dims // 2
        out = mx.concatenate([-x[..., h:dims], x[..., :h]], axis=-1)
    return out if dims == x.shape[-1] else mx.concatenate([out, x[..., dims:]], axis=-1)


@mx.compile
def _rms_norm(x: mx.array, weight: mx.array, eps: mx.array) -> mx.array:
    return weight * (x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps))


class LeanRMSNorm(nn.Module):
    """An `nn.RMSNorm` (float32) as one compiled function."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps
        self._eps = mx.array(norm.eps, dtype=mx.float32)

    def __call__(self, x: mx.array) -> mx.array:
        return _rms_norm(x, self.weight, self._eps)


def _swiglu_mlps() -> tuple:
    """MLP classes whose forward is exactly `down_proj(swiglu(gate_proj(x), up_proj(x)))`
    (tests/cpu/test_layers.py checks each against its own forward, bit for bit)."""
    from mlx_lm.models import llama, qwen2, qwen3

    return (llama.MLP, qwen2.MLP, qwen3.MLP)


class LeanMLP(nn.Module):
    """A SwiGLU MLP (the model's own gate_proj, up_proj and down_proj) whose activation
    runs in the small-batch kernel; input it cannot take keeps mlx-lm's `swiglu`."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

    @classmethod
    def fused(cls, gate_up: nn.Module, down_proj: nn.Module) -> "LeanMLP":
        """An MLP whose gate and up projections are one product, gate's columns first
        (cpu/fused_projections.py)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.gate_up, new.down_proj = gate_up, down_proj
        return new

    def __call__(self, x: mx.array) -> mx.array:
        if "gate_up" in self:
            y = self.gate_up(x)
            n = y.shape[-1] // 2
            gate, up = y[..., :n], y[..., n:]
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if gate.dtype == up.dtype == mx.float32 and gate.shape == up.shape and \
                gate.shape[-1] % kernel_ops.SWIGLU_WIDTH == 0:
            return self.down_proj(kernel_ops.swiglu(gate, up))
        return self.down_proj(swiglu(gate, up))


def _replaceable(m) -> str | None:
    if type(m) is nn.RoPE:
        return "rope"
    if type(m) is nn.RMSNorm and m.weight.dtype == mx.float32:
        return "norm"
    if type(m) in _swiglu_mlps() and kernel_ops.usable("swiglu"):
        return "mlp"
    return None


def prepare(model: nn.Module) -> dict[str, int]:
    """Replace `model`'s plain RoPE and float32 RMSNorm modules (CPU backend only);
    how many of each."""
    from ..arch.surgery import put_module

    counts: dict[str, int] = {}
    if not wanted():
        return counts
    if lean_attention.install(model):
        counts["attention"] = 1
    tables: dict[tuple, RopeTables] = {}
    for path, m in list(model.named_modules()):
        kind = _replaceable(m)
        if kind is None or not path:
            continue
        if kind == "rope":
            key = (m.dims, float(m.base), float(m.scale), bool(m.traditional))
            new = LeanRope(m, tables.setdefault(key, RopeTables(*key)))
        elif kind == "mlp":
            new = LeanMLP(m)
        else:
            new = LeanRMSNorm(m)
        put_module(model, path, new)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


_KINDS = {LeanRope: "rope", LeanRMSNorm: "norm", LeanMLP: "mlp"}


def applied(model) -> str:
    """What `prepare` slimmed in `model` ("mlp+norm+rope", "" for nothing): a
    calibration depends on it."""
    if model is None:
        return ""
    kinds = {_KINDS[type(m)] for _, m in model.named_modules() if type(m) in _KINDS}
    return "+".join(sorted(kinds | ({"attention"} if kinds and lean_attention.applies_to(model) else set())))
