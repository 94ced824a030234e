"""How a converted GGUF's weights are stored: float16 matrices, float32 vectors.

The CPU backend computes in float32 (models/loading.py casts on load), Metal in float16 as
mlx-lm does; on disk float16 halves the converted folder.  A GGUF's own weights
are 4- to 8-bit codes with float16 scales, so float16 changes the dequantised
values by far less than the quantisation step; `Rounding` measures by how much,
and the converter records it in `config.json` (`mlxspec.storage`).  With `float16`
off every tensor stays float32 (what mlxspec 0.1 wrote; benchmarks/storage_dtype.py
compares the two).
"""

from __future__ import annotations

import numpy as np

SHARD_BYTES = 2 << 30
STORE_DTYPE = np.float16  # matrices on disk (vectors stay float32)
NORMAL_MIN = float(np.finfo(np.float16).tiny)  # below it float16 is subnormal: only the absolute change is meaningful
CHUNK_ELEMENTS = 1 << 22  # weights Rounding compares at a time (whole rows): a few arrays of 16 MB at most


def stored_bytes(shape, float16: bool = True) -> int:
    """Bytes a tensor of `shape` takes on disk: float16 matrices (with `float16`), float32 vectors."""
    return (2 if len(shape) > 1 and float16 else 4) * int(np.prod(shape))


def to_storage(w: np.ndarray, float16: bool = True) -> np.ndarray:
    """`w` as stored: float16 for a matrix whose values float16 holds (with `float16`), else
    float32 unchanged."""
    if w.ndim < 2 or not float16:
        return w
    with np.errstate(over="ignore"):
        stored = w.astype(STORE_DTYPE)
    return stored if np.isfinite(stored).all() else w


class Rounding:
    """The largest change storage made to any weight: absolute, and relative to the weight (for
    weights in float16's normal range; smaller ones change by at most 3e-8 absolute)."""

    def __init__(self, float16: bool = True):
        self.dtype = STORE_DTYPE if float16 else np.float32  # of the matrices, as `to_storage` stores them
        self.max_abs = self.max_rel = 0.0
        self.float32_matrices = 0

    def add(self, w: np.ndarray, stored: np.ndarray, chunk: int = CHUNK_ELEMENTS) -> None:
        """Compare `chunk` weights at a time (at least a row): differences of a whole embedding
        matrix would take as much memory again as the matrix."""
        if stored.dtype == w.dtype:
            self.float32_matrices += w.ndim > 1
            return
        rows = max(1, chunk // max(1, int(np.prod(w.shape[1:]))))
        for i in range(0, len(w), rows):
            self._add(w[i: i + rows], stored[i: i + rows])

    def _add(self, w: np.ndarray, stored: np.ndarray) -> None:
        diff = np.abs(stored.astype(np.float32) - w)
        self.max_abs = max(self.max_abs, float(diff.max(initial=0.0)))
        normal = np.abs(w) >= NORMAL_MIN
        if normal.any():
            self.max_rel = max(self.max_rel, float((diff[normal] / np.abs(w[normal])).max()))

    def to_dict(self) -> dict:
        return {"dtype": np.dtype(self.dtype).name, "max_abs_change": self.max_abs,
                "max_rel_change": self.max_rel, "float32_matrices": self.float32_matrices}


def shard_plan(tensors, limit: int = SHARD_BYTES, float16: bool = True) -> list[list]:
    """Group tensors into consecutive shards of at most `limit` stored bytes (at least one each)."""
    shards, size = [[]], 0
    for t in tensors:
        nbytes = stored_bytes(tuple(t.shape), float16)
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    return shards
