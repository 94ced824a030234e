"""The draft's weights as int8, one scale per output column: half the bytes of its
16-bit weights, multiplied by draft_gemm.c (integer dot products, AVX-512 VNNI).

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
q + 128 in draft_gemm.c's layout (column blocks of 64; inside, four consecutive
inputs of each column together).  The kernel rounds each activation row to int8 in
blocks of 32 (llama.cpp's Q8_0), multiplies in integers, and scales each column of
the product by s (addmm's C carries s).  The bias, if any, is added after.
MLXSPEC_DRAFT_INT8=0 keeps the draft's weights as they are (packed_weights.py).
"""

from __future__ import annotations

import functools
import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import packed_weights, small_gemm
from .packed_weights import NB, PackedLinear

ENV = "MLXSPEC_DRAFT_INT8"  # "0": the draft keeps its exact weights
FMT = "i8"
QMAX = 127  # symmetric: q in [-QMAX, QMAX]
QB = 32  # draft_gemm.c's activation block: the in-dimension must be a multiple


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
    """int8 (out N, in K) -> draft_gemm.c's flat bytes: q + 128; column block b (outputs
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


@functools.cache
def works() -> bool:
    """Does the kernel compute int8 products as documented (checked once, on a small product,
    against the same rounding done here in float64)?"""
    if not packed_weights.available() or not small_gemm.formats() & packed_weights.FORMAT_BIT[FMT]:
        return False
    rng = np.random.default_rng(0)
    K, N = 4 * QB, 2 * NB + 7  # two full blocks and a narrow one
    w = rng.standard_normal((N, K)).astype(np.float32)
    layer = Int8Linear.from_rows(w)
    q, s = quantise(w)
    x = rng.standard_normal((3, 2, K)).astype(np.float32)
    want = reference(x, q, s)
    got, one = np.array(layer(mx.array(x))), np.array(layer(mx.array(x[0, 0])))
    return bool(np.allclose(got, want, rtol=1e-4, atol=1e-4) and np.allclose(one, want[0, 0], rtol=1e-4, atol=1e-4))


def rounded_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, scale per block of QB) of activation rows x (..., K), as draft_gemm.c rounds them."""
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
    int8 weights, one layer at a time; run before packed_weights.prepare, which packs
    what is left.  Returns how many layers changed."""
    from .blas_layout import module_at, put_module

    if not wanted():
        return 0
    done = 0
    todo = [path for path, m in model.named_modules() if type(m) is nn.Linear and m.weight.dtype == mx.float32
            and m.weight.shape[1] % QB == 0]
    for path in todo:
        old = module_at(model, path)
        w = np.asarray(memoryview(old.weight))
        put_module(model, path, Int8Linear.from_rows(w, old["bias"] if "bias" in old else None))
        done += 1
    return done
