"""The draft's weights rounded: 4-bit in groups of 32 inputs (cpu/draft_gemm4.c), or int8
with one scale per output column (cpu/draft_gemm.c) -- a quarter or half the bytes of its
16-bit weights, multiplied in integers (AVX-512 VNNI, AMX tiles for many rows; AVX2 VPMADDUBSW).

A draft step streams every draft weight once, so its time is mostly bytes: on this
CPU the default draft's 16-bit products take ~26 ms of a ~36 ms step.
The draft only proposes.  Speculative sampling accepts a token with min(1, p/q) and
resamples from norm(max(0, p - q)), where q is the distribution the draft actually
sampled from -- whatever weights computed it -- and greedy decoding keeps the
target's own argmax.  So a draft with rounded weights leaves the output exactly
the target's (the loop's tests check it on int8 drafts); it can only change how
often the target agrees.  The target's weights are never rounded.

Each (out, in) weight w becomes q = round(w / s) in [-127, 127] with
s = max |w[n, :]| / 127 per output n (symmetric, per channel), stored as bytes
q + 128 in cpu/draft_gemm.c's layout (column blocks of 64; inside, four consecutive
inputs of each column together).  The kernel rounds each activation row to int8 in
blocks of 32 (llama.cpp's Q8_0), multiplies in integers, and scales each column of
the product by s (addmm's C carries s).  The bias, if any, is added after.  A
single row (a draft step) goes as two half rows against the same bytes seen as
(K/2, N/2): the output is then the row itself, and C, which MLX copies into it,
is s as stored (Int8Linear.__call__; N even).

4-bit (MLXSPEC_DRAFT_BITS=4, for layers whose outputs are whole column blocks of
64): each group of 32 inputs of an output n becomes q = round(w / g) in [-8, 7] with
g = m / -8, m the group's value of largest magnitude (llama.cpp's Q4_0), stored as
float16 (q is rounded against the stored g), as nibbles q + 8 in cpu/draft_gemm4.c's
layout; the product's block sums are exact integers, each scaled by the activation
block's scale times g.  The output projection (and so the pruned head,
drafting/vocab_subset.py) stays int8.  A step of the default draft streams 260 MB instead of
417 MB and its one-row products take 9 ms instead of 14; measured on the code suite
(`benchmarks/draft_bits.py`), chains gained 1.06x-1.08x but the default trees 0.99x
(their wide draft forwards hardly get cheaper, and the rounding costs some
agreement), so it is not the default.  MLXSPEC_DRAFT_INT8=0 keeps the draft's
weights as they are (cpu/packed_weights.py).
"""

from __future__ import annotations

import functools
import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import packed_weights, kernel as small_gemm
from .packed_weights import NB, PackedLinear

ENV = "MLXSPEC_DRAFT_INT8"  # "0": the draft keeps its exact weights
BITS_ENV = "MLXSPEC_DRAFT_BITS"  # "4": 4-bit where the layout fits; otherwise int8 (the default)
FMT = "i8"
FMT4 = "i4"
QMAX = 127  # symmetric: q in [-QMAX, QMAX]
Q4MAX = 7  # 4-bit: q in [-Q4MAX - 1, Q4MAX]; the largest magnitude maps to -Q4MAX - 1
QB = 32  # cpu/draft_gemm.c's activation block: the in-dimension must be a multiple
PAIRS_ALPHA = packed_weights.alpha_of("i8 pairs")  # one row's call (Int8Linear.__call__)


def wanted() -> bool:
    """Should a draft loaded now get int8 weights (kernel loaded, packing on, not turned off)?"""
    return os.environ.get(ENV, "1") != "0" and packed_weights.available() and works()


def quantise(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 (out, in), s float32 (out,)) for the float32 (out, in) weight `w`."""
    top = np.abs(w).max(axis=1)
    s = np.where(top > 0, top / QMAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / s[:, None]), -QMAX, QMAX).astype(np.int8)
    return q, s


def to_blocks(q: np.ndarray) -> np.ndarray:
    """int8 (out N, in K) -> cpu/draft_gemm.c's flat bytes: q + 128; column block b (outputs
    64b..64b+63) holds, for each group of four inputs, its 64 columns' four bytes; the
    last block may be narrower."""
    N, K = q.shape
    u = (q.astype(np.int16) + 128).astype(np.uint8)
    full = N // NB * NB
    main = u[:full].reshape(N // NB, NB, K // 4, 4).transpose(0, 2, 1, 3).reshape(-1)
    tail = u[full:].reshape(N - full, K // 4, 4).transpose(1, 0, 2).reshape(-1)
    return np.concatenate([main, tail])


def from_blocks(flat: np.ndarray, K: int, N: int, ids=None) -> np.ndarray:
    """The inverse of `to_blocks`: int8 (out N, in K), or only the outputs `ids`, gathered
    from the blocks without unpacking the rest."""
    ids = np.arange(N) if ids is None else np.asarray(ids, dtype=np.int64)
    full = N // NB * NB
    u = np.empty((len(ids), K // 4, 4), dtype=np.uint8)
    inside = ids < full
    u[inside] = flat[:full * K].reshape(N // NB, K // 4, NB, 4)[ids[inside] // NB, :, ids[inside] % NB, :]
    if not inside.all():
        u[~inside] = flat[full * K:].reshape(K // 4, N - full, 4)[:, ids[~inside] - full, :].transpose(1, 0, 2)
    return (u.reshape(len(ids), K).astype(np.int16) - 128).astype(np.int8)


def _as_float32(flat: np.ndarray, K: int, N: int) -> mx.array:
    """The bytes as the float32 (K/4, N) array MLX is given."""
    return mx.array(np.ascontiguousarray(flat).view(np.float32).reshape(K // 4, N))


class Int8Linear(PackedLinear):
    """A linear layer whose weight is int8 with a scale per output column."""

    def __init__(self, packed: mx.array, scales: mx.array, K: int, N: int, bias: mx.array | None = None):
        self.scales = scales  # set first: PackedLinear evaluates the parameters
        super().__init__(packed, K, N, FMT, bias)
        self._row = None  # (packed, its bytes as (K/2, N/2), scales as (2, N/2)): one row's call, N even
        if N % 2 == 0:
            pairs, c = packed.reshape(K // 2, N // 2), scales.reshape(2, N // 2)
            mx.eval(pairs, c)  # views of the same memory
            self._row = (packed, pairs, c)

    def __call__(self, x: mx.array) -> mx.array:
        """One row (a draft step): B as (K/2, N/2) and A as (2, K/2), so the output is the row
        itself and C, which MLX copies into it, is the scales as stored -- three operations and a
        copy of N values, where the (4, K/4) call makes five and copies 4N.  The kernel computes
        the same sums either way (cpu/small_gemm.c's PACKED_I8_PAIRS)."""
        row = self._row
        if row is None or x.size != self.in_dims or row[0] is not self.packed:
            return super().__call__(x)
        y = mx.addmm(row[2], x.reshape(2, self.in_dims // 2), row[1], alpha=PAIRS_ALPHA, beta=1.0)
        y = y.reshape(*x.shape[:-1], self.out_dims)
        return y + self["bias"] if "bias" in self else y

    @classmethod
    def from_rows(cls, w: np.ndarray, bias: mx.array | None = None) -> "Int8Linear":
        """Quantise the (out, in) float32 weight `w` (in a multiple of QB)."""
        N, K = w.shape
        q, s = quantise(w)
        return cls(_as_float32(to_blocks(q), K, N), mx.array(s), K, N, bias)

    def q(self, ids=None) -> np.ndarray:
        """The stored int8 weight, (out, in): all outputs, or those in `ids`."""
        flat = np.asarray(memoryview(self.packed)).reshape(-1).view(np.uint8)
        return from_blocks(flat, self.in_dims, self.out_dims, ids)

    def wt(self) -> mx.array:
        """The weight the kernel rounds to, (in, out) float32: q x s."""
        return mx.array((self.q().astype(np.float32) * np.asarray(self.scales)[:, None]).T)

    def take_columns(self, ids) -> "Int8Linear":
        """An Int8Linear of the output columns `ids` (no bias), from the stored q and s."""
        q, s = self.q(ids), np.asarray(self.scales)[np.asarray(ids, dtype=np.int64)]
        return Int8Linear(_as_float32(to_blocks(q), self.in_dims, len(q)), mx.array(s), self.in_dims, len(q))

    def product_c(self) -> tuple[mx.array, float]:
        """addmm's C and beta: each column's scale, which the kernel multiplies by."""
        return self.scales, 1.0


def quantise4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 (out, in) in [-8, 7], g float16 (out, in / QB)) for the float32 (out, in) weight `w`:
    g = m / -(Q4MAX + 1), m the group's value of largest magnitude (so m itself is q = -8 and
    all 16 levels are used, as llama.cpp's Q4_0 does), q rounded against the stored g."""
    N, K = w.shape
    groups = w.reshape(N, K // QB, QB)
    m = np.take_along_axis(groups, np.abs(groups).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    g = (m / -(Q4MAX + 1)).astype(np.float16)
    gf = g.astype(np.float32)
    q = np.clip(np.rint(groups / np.where(gf != 0, gf, 1)[..., None]), -8, 7).astype(np.int8)
    q[gf == 0] = 0
    return q.reshape(N, K), g


def to_blocks4(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """4-bit q (out N, in K; N a multiple of 64) and its group scales -> cpu/draft_gemm4.c's flat
    bytes: per column block, the nibbles (per QB inputs, four pairs of four-input groups,
    low nibble the first group) and then the block's float16 scales, group by group."""
    N, K = q.shape
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(N // NB, NB, K // QB, QB // 8, 2, 4)
    u = u.transpose(0, 2, 3, 1, 5, 4)  # (block, group of QB, pair, column, input, half)
    nibbles = (u[..., 0] | (u[..., 1] << 4)).reshape(N // NB, -1)
    scales = np.ascontiguousarray(g.reshape(N // NB, NB, K // QB).transpose(0, 2, 1)).view(np.uint8)
    return np.concatenate([nibbles, scales.reshape(N // NB, -1)], axis=1).reshape(-1)


def from_blocks4(flat: np.ndarray, K: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `to_blocks4`: (q int8 (out N, in K), g float16 (out N, in K / QB))."""
    per = flat.reshape(N // NB, -1)
    nib = per[:, :K * NB // 2].reshape(N // NB, K // QB, QB // 8, NB, 4)
    u = np.stack([nib & 0x0F, nib >> 4], axis=-1)  # (block, group, pair, column, input, half)
    q = (u.transpose(0, 3, 1, 2, 5, 4).reshape(N, K).astype(np.int16) - 8).astype(np.int8)
    g = np.ascontiguousarray(per[:, K * NB // 2:]).view(np.float16).reshape(N // NB, K // QB, NB)
    return q, g.transpose(0, 2, 1).reshape(N, K // QB)


class Int4Linear(PackedLinear):
    """A linear layer whose weight is 4-bit with a float16 scale per group of QB inputs."""

    def __init__(self, packed: mx.array, K: int, N: int, bias: mx.array | None = None):
        super().__init__(packed, K, N, FMT4, bias)

    @staticmethod
    def fits(N: int, K: int) -> bool:
        return N % NB == 0 and K % QB == 0

    @classmethod
    def from_rows(cls, w: np.ndarray, bias: mx.array | None = None) -> "Int4Linear":
        """Quantise the (out, in) float32 weight `w` (out a multiple of 64, in of QB)."""
        N, K = w.shape
        q, g = quantise4(w)
        flat = to_blocks4(q, g)
        return cls(mx.array(flat.view(np.float32).reshape(K // 8, 9 * N // 8)), K, N, bias)

    def q(self) -> tuple[np.ndarray, np.ndarray]:
        """The stored (q (out, in), g (out, in / QB))."""
        flat = np.asarray(memoryview(self.packed)).reshape(-1).view(np.uint8)
        return from_blocks4(flat, self.in_dims, self.out_dims)

    def wt(self) -> mx.array:
        """The weight the kernel rounds to, (in, out) float32: q x g."""
        q, g = self.q()
        w = q.reshape(len(q), -1, QB).astype(np.float32) * g.astype(np.float32)[..., None]
        return mx.array(w.reshape(len(q), -1).T)

    def take_columns(self, ids) -> "Int8Linear":
        """The output columns `ids` (no bias), as int8 columns of the values stored here."""
        return Int8Linear.from_rows(np.ascontiguousarray(np.array(self.wt()).T[np.asarray(ids, dtype=np.int64)]))

    def product_c(self) -> tuple[mx.array, float]:
        """The kernel writes the product (beta 0); a bias is added after."""
        return packed_weights._ZERO, 0.0


def bits() -> int:
    """4 or 8: what `prepare` rounds a draft's layers to (MLXSPEC_DRAFT_BITS; 8 unless it says 4)."""
    return 4 if os.environ.get(BITS_ENV, "8") == "4" else 8


def reference4(x: np.ndarray, q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """What cpu/draft_gemm4.c computes for rows x (..., K), 4-bit q (N, K), scales g (N, K/QB), in float64."""
    xq, d = rounded_rows(x)
    blocks = xq.reshape(*x.shape[:-1], -1, QB).astype(np.float64)
    per_block = np.einsum("...bk,nbk->...bn", blocks, q.reshape(q.shape[0], -1, QB).astype(np.float64))
    return (per_block * d[..., None] * g.astype(np.float64).T).sum(axis=-2)


@functools.cache
def works4() -> bool:
    """Does the kernel compute 4-bit products as documented (checked once, on a small product)?"""
    if not works() or not small_gemm.formats() & packed_weights.FORMAT_BIT[FMT4]:
        return False
    return _as_documented(Int4Linear, quantise4, reference4, 2 * NB)


def _as_documented(cls, quantise_fn, reference_fn, N: int) -> bool:
    """Does a `cls` layer's product, over many rows and over one, equal `reference_fn` of its rounding
    (to float32's rounding)?"""
    rng = np.random.default_rng(0)
    K = 4 * QB
    w = rng.standard_normal((N, K)).astype(np.float32)
    layer = cls.from_rows(w)
    x = rng.standard_normal((3, 2, K)).astype(np.float32)
    want = reference_fn(x, *quantise_fn(w))
    got, one = np.array(layer(mx.array(x))), np.array(layer(mx.array(x[0, 0])))
    return bool(np.allclose(got, want, rtol=1e-4, atol=1e-4) and np.allclose(one, want[0, 0], rtol=1e-4, atol=1e-4))


@functools.cache
def works() -> bool:
    """Does the kernel compute int8 products as documented (checked once, on a small product,
    against the same rounding done here in float64)?"""
    if not packed_weights.available() or not small_gemm.formats() & packed_weights.FORMAT_BIT[FMT]:
        return False
    return _as_documented(Int8Linear, quantise, reference, 2 * NB + 7)  # two full blocks and a narrow one


def rounded_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, scale per block of QB) of activation rows x (..., K), as cpu/draft_gemm.c rounds them."""
    b = x.reshape(*x.shape[:-1], -1, QB).astype(np.float32)
    top = np.abs(b).max(axis=-1, keepdims=True)
    inv = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.clip(np.rint(b * inv), -127, 127)
    return q.reshape(x.shape), (top[..., 0] / np.float32(127)).astype(np.float32)


def reference(x: np.ndarray, q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """What the kernel computes for rows x (..., K), int8 q (N, K), scales s (N,), in float64."""
    xq, d = rounded_rows(x)
    blocks = xq.reshape(*x.shape[:-1], -1, QB).astype(np.float64)
    per_block = np.einsum("...bk,nbk->...bn", blocks, q.reshape(q.shape[0], -1, QB).astype(np.float64))
    return (per_block * d[..., None]).sum(axis=-2) * s


def prepare(model: nn.Module) -> int:
    """Give every float32 linear layer of the draft `model` (in-dimension a multiple of QB)
    4-bit weights where they fit (`bits`), int8 otherwise, one layer at a time; run before
    packed_weights.prepare, which packs what is left.  Returns how many layers changed."""
    from ..arch.surgery import module_at, put_module

    if not wanted():
        return 0
    done = 0
    todo = [path for path, m in model.named_modules() if type(m) is nn.Linear and m.weight.dtype == mx.float32
            and m.weight.shape[1] % QB == 0]
    for path in todo:
        old = module_at(model, path)
        w = np.asarray(memoryview(old.weight))
        bias = old["bias"] if "bias" in old else None
        four = bits() == 4 and Int4Linear.fits(*w.shape) and path.split(".")[-1] != "lm_head" and works4()
        put_module(model, path, (Int4Linear if four else Int8Linear).from_rows(w, bias))
        done += 1
    return done
