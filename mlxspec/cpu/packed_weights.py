"""Weights packed for the small-batch kernel (cpu/small_gemm.c): column blocks, and
16 bits per weight where that is exact.

A decode step streams every weight once, so its time is bytes.  Two layouts cut
them, measured here with a C driver over the default target's 28 layers of
matmuls (min of 7; `benchmarks/packed_weights.py` measures whole models):
- Column blocks: each block of 64 output columns stores its K rows contiguously,
  so the kernel reads one stream per block instead of K short strided pieces;
  1 / 8 / 16 rows 122 / 178 / 233 ms -> 103 / 141 / 171 ms.
- 16-bit storage: the default pair was converted from float16 GGUF files, so
  every weight is a float16 value held as float32.  Stored as float16 (or as
  bfloat16, for bf16 checkpoints) and widened exactly before each multiply,
  the product is bit for bit the float32 one at half the bytes; 1 / 8 rows
  56 / 104 ms.  A weight matrix that is not exact in 16 bits stays float32.

MLX sends only float32 products to `cblas_sgemm`, so a packed weight is held as
a float32 array of the same bytes and the call is marked by its `alpha` (a bit
pattern no real call uses; cpu/small_gemm.c's PACKED_*), which the kernel reads as
"B is packed in format F".  A 16-bit (K, N) weight is a float32 (K/2, N) array;
A is passed as (2M, K/2) and C as (2M, N) -- the same memory -- and the first M
rows of C are the product; a bias is addmm's C.  Nothing is registered and
nothing outlives the array.  Each format is tested once on a small product
(`works`) and nothing is packed in a format the kernel does not compute exactly
(a future MLX that calls the BLAS differently); a malformed 16-bit call gives NaN.

The model's own forward runs: a `PackedLinear` is called where the model calls
its linear layer (as cpu/blas_layout.py's `TransposedLinear`).  Only the CPU
backend with the kernel loaded packs; MLXSPEC_PACKED=0 turns it off, =f32 keeps
float32 (blocks only).
"""

from __future__ import annotations

import os
import struct

import mlx.core as mx
import mlx.nn as nn
import numpy as np

ENV = "MLXSPEC_PACKED"  # "0": off; "f32": column blocks only; default: 16 bits where exact
NB = 64  # columns per block (cpu/small_gemm.c's NB)
ALPHA_BITS = {"f32": 0x7E5A3C01, "f16": 0x7E5A3C02, "bf16": 0x7E5A3C03, "i8": 0x7E5A3C04,
              "i4": 0x7E5A3C05, "i8 pairs": 0x7E5A3C06}  # cpu/small_gemm.c's PACKED_*
FORMAT_BIT = {"f32": 1, "f16": 2, "bf16": 4, "i8": 8, "i4": 16}  # mlxspec_gemm_formats(); i8, i4: cpu/draft_weights.py
SPLIT = {"f32": 1, "f16": 2, "bf16": 2, "i8": 4, "i4": 8}  # rows the kernel is passed per real row (see the top)

_checked: dict[str, bool] = {}
_ZERO = mx.array(0.0, dtype=mx.float32)  # addmm's C when there is no bias


def alpha_of(fmt: str) -> float:
    """The float whose bits mark a call on a weight packed as `fmt` (cpu/small_gemm.c's PACKED_*)."""
    return struct.unpack("<f", struct.pack("<I", ALPHA_BITS[fmt]))[0]


def setting() -> str:
    """'0' (off), 'f32' or '16' (the default)."""
    v = os.environ.get(ENV, "16")
    return v if v in ("0", "f32") else "16"


def available() -> bool:
    """Can this process pack (CPU backend, the kernel loaded, not turned off)?"""
    from . import blas_layout, kernel as small_gemm

    return setting() != "0" and blas_layout.wanted() and small_gemm.loaded()


def _kernel_formats() -> int:
    from . import kernel as small_gemm

    return small_gemm.formats()


def narrowed(w: np.ndarray, narrow: bool = True) -> tuple[str, np.ndarray]:
    """(format, values): `w` (float32, in-dimension last) in the narrowest format
    that holds every value exactly -- float16, bfloat16 (as its 16 high bits) or
    float32 -- and with an even in-dimension for 16 bits."""
    if narrow and setting() == "16" and w.shape[-1] % 2 == 0:
        if _kernel_formats() & FORMAT_BIT["f16"]:
            with np.errstate(over="ignore"):
                h = w.astype(np.float16)
            if np.array_equal(h.astype(np.float32), w):
                return "f16", h.view(np.uint16)
        bits = w.view(np.uint32)
        if not (bits & 0xFFFF).any():
            return "bf16", (bits >> 16).astype(np.uint16)
    return "f32", w


def choose_format(wt: np.ndarray, narrow: bool = True) -> str:
    """The format `narrowed` picks for an (in, out) weight `wt`."""
    return narrowed(np.ascontiguousarray(wt.T), narrow)[0]


def block_rows(w: np.ndarray) -> np.ndarray:
    """An (out, in) weight -> flat column blocks of its (in, out) transpose: block b
    (outputs 64b..64b+63) holds its `in` rows contiguously, 64 values each; the last
    block may be narrower."""
    N, K = w.shape
    full = N // NB * NB
    blocks = w[:full].reshape(N // NB, NB, K).transpose(0, 2, 1).reshape(-1)
    return blocks if full == N else np.concatenate([blocks, np.ascontiguousarray(w[full:].T).reshape(-1)])


def block(wt: np.ndarray) -> np.ndarray:
    """(K, N) row-major -> flat column blocks (see `block_rows`)."""
    return block_rows(wt.T)


def unblock(flat: np.ndarray, K: int, N: int) -> np.ndarray:
    full = N // NB * NB
    out = np.empty((K, N), dtype=flat.dtype)
    out[:, :full] = flat[:K * full].reshape(N // NB, K, NB).transpose(1, 0, 2).reshape(K, full)
    if full < N:
        out[:, full:] = flat[K * full:].reshape(K, N - full)
    return out


def _widened(values: np.ndarray, fmt: str) -> np.ndarray:
    """Stored values (float32, or float16 / bfloat16 bits) as float32."""
    if fmt == "f16":
        return values.view(np.float16).astype(np.float32)
    if fmt == "bf16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values


def _as_float32(flat: np.ndarray, K: int, N: int) -> mx.array:
    """Blocked elements (float32, or 16-bit) as the float32 array MLX is given: (K, N) or (K/2, N)."""
    return mx.array(flat.view(np.float32).reshape(K if flat.dtype == np.float32 else K // 2, N))


class PackedLinear(nn.Module):
    """A linear layer whose (in, out) weight is packed for cpu/small_gemm.c."""

    def __init__(self, packed: mx.array, K: int, N: int, fmt: str, bias: mx.array | None = None):
        super().__init__()
        self.packed = packed
        if bias is not None:
            self.bias = bias
        self.in_dims, self.out_dims, self.fmt = K, N, fmt
        self._alpha = alpha_of(fmt)
        mx.eval(self.parameters())

    @classmethod
    def from_rows(cls, w: np.ndarray, bias: mx.array | None = None, narrow: bool = True) -> "PackedLinear":
        """Pack the (out, in) float32 weight `w` in the narrowest exact format."""
        N, K = w.shape
        fmt, values = narrowed(w, narrow)
        return cls(_as_float32(block_rows(values), K, N), K, N, fmt, bias)

    @classmethod
    def from_weight(cls, wt: mx.array, bias: mx.array | None, fmt: str) -> "PackedLinear":
        """Pack the (in, out) float32 weight `wt` as `fmt` (which must hold it exactly)."""
        w = np.ascontiguousarray(np.array(wt, dtype=np.float32).T)
        values = {"f32": lambda: w, "f16": lambda: w.astype(np.float16).view(np.uint16),
                  "bf16": lambda: (w.view(np.uint32) >> 16).astype(np.uint16)}[fmt]()
        if not np.array_equal(_widened(values, fmt), w):
            raise ValueError(f"the weight is not exact in {fmt}")
        K, N = wt.shape
        return cls(_as_float32(block_rows(values), K, N), K, N, fmt, bias)

    def wt(self) -> mx.array:
        """The weight, (in, out) float32, unpacked (for code that inspects it)."""
        flat = np.array(self.packed).reshape(-1)
        return mx.array(unblock(_widened(flat if self.fmt == "f32" else flat.view(np.uint16), self.fmt),
                                self.in_dims, self.out_dims))

    def take_columns(self, ids) -> "PackedLinear":
        """A PackedLinear of the output columns `ids` (same format, no bias), gathered
        from the packed storage without unpacking the rest."""
        K, N = self.in_dims, self.out_dims
        raw = np.asarray(memoryview(self.packed)).reshape(-1).view(np.float32 if self.fmt == "f32" else np.uint16)
        ids = np.asarray(ids, dtype=np.int64)
        full = N // NB * NB
        cols = np.empty((K, len(ids)), dtype=raw.dtype)
        inside = ids < full
        cols[:, inside] = raw[:K * full].reshape(N // NB, K, NB)[ids[inside] // NB, :, ids[inside] % NB].T
        if not inside.all():
            cols[:, ~inside] = raw[K * full:].reshape(K, N - full)[:, ids[~inside] - full]
        return PackedLinear(_as_float32(block(cols), K, len(ids)), K, len(ids), self.fmt)

    @property
    def weight(self) -> mx.array:
        """(out, in), as mlx-lm lays it out (unpacked: a copy)."""
        return self.wt().T

    def __call__(self, x: mx.array) -> mx.array:
        """x @ W + bias: one addmm on the rows of x as a 2-D matrix (the shape MLX is
        known to send to `cblas_sgemm`: a broadcast view of one row takes another path),
        the bias as its C.  For 16 bits each row is passed as two half rows and the
        first half of the result is kept (int8: four quarter rows, 4-bit: eight; cpu/draft_weights.py)."""
        lead = x.shape[:-1]
        rows = 1
        for d in lead:
            rows *= d
        split = SPLIT[self.fmt]
        c, beta = self.product_c()
        y = mx.addmm(c, x.reshape(split * rows, self.in_dims // split), self.packed, alpha=self._alpha, beta=beta)
        if split > 1:  # 4-bit: the packed width holds the group scales too (cpu/draft_weights.py)
            y = y[:rows, :self.out_dims]
        if "bias" in self and c is not self["bias"]:  # C held something else (int8: the scales)
            y = y + self["bias"]
        return y.reshape(*lead, self.out_dims)

    def product_c(self) -> tuple[mx.array, float]:
        """addmm's C and beta: the bias, if any."""
        return (self["bias"], 1.0) if "bias" in self else (_ZERO, 0.0)


def works(fmt: str) -> bool:
    """Does the kernel compute a product on `fmt`-packed weights exactly (checked once)?"""
    if fmt not in _checked:
        if not _kernel_formats() & FORMAT_BIT[fmt]:
            _checked[fmt] = False
            return False
        rng = np.random.default_rng(0)
        K, N = 130, 2 * NB + 7  # two full blocks and a narrow one
        w = rng.standard_normal((K, N)).astype(np.float16).astype(np.float32)
        if fmt == "bf16":
            w = (w.view(np.uint32) & 0xFFFF0000).view(np.float32)
        x = rng.standard_normal((3, 2, K)).astype(np.float32)
        want = np.einsum("abk,kn->abn", x.astype(np.float64), w.astype(np.float64))
        layer = PackedLinear.from_weight(mx.array(w), None, fmt)
        got, one = np.array(layer(mx.array(x))), np.array(layer(mx.array(x[0, 0])))  # many rows, one row
        _checked[fmt] = bool(np.allclose(got, want, rtol=1e-4, atol=1e-4)
                             and np.allclose(one, want[0, 0], rtol=1e-4, atol=1e-4))
    return _checked[fmt]


def pack(wt: mx.array, bias: mx.array | None = None, narrow: bool = True):
    """A PackedLinear for the (in, out) float32 weight `wt`, or None (packing unavailable)."""
    if not available() or wt.dtype != mx.float32 or wt.ndim != 2:
        return None
    return _checked_pack(np.ascontiguousarray(np.array(wt).T), bias, narrow)


def _checked_pack(w: np.ndarray, bias, narrow: bool):
    fmt = narrowed(w, narrow)[0]
    if not works(fmt):
        if not works("f32"):
            return None
        narrow = False
    return PackedLinear.from_rows(w, bias, narrow)


def prepare(model: nn.Module, narrow: bool = True) -> dict[str, int]:
    """Pack every float32 `nn.Linear` of `model` (run before blas_layout.prepare,
    which lays out what is left); how many layers went to each format.  One layer
    at a time, so memory never holds more than one extra weight."""
    from ..arch.surgery import module_at, put_module

    counts: dict[str, int] = {}
    if not available():
        return counts
    todo = [path for path, m in model.named_modules() if type(m) is nn.Linear and m.weight.dtype == mx.float32]
    for path in todo:
        old = module_at(model, path)
        new = _checked_pack(np.asarray(memoryview(old.weight)), old["bias"] if "bias" in old else None, narrow)
        if new is None:
            break
        put_module(model, path, new)
        counts[new.fmt] = counts.get(new.fmt, 0) + 1
    return counts


def layout(model) -> str:
    """The packed formats of `model`, for calibration keys: e.g. "packed f16", or ""."""
    if model is None:
        return ""
    fmts = sorted({m.fmt for _, m in model.named_modules() if isinstance(m, PackedLinear)})
    return f"packed {'+'.join(fmts)}" if fmts else ""
