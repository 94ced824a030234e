"""benchmarks/kernel_ab.py packs its random weights itself (the packing modules import
MLX, which it must not load next to its own kernel builds): its layouts must be the
ones the package gives the kernel, or it would time other memory patterns."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import kernel_ab  # noqa: E402

from mlxspec.cpu import draft_weights, packed_weights  # noqa: E402


def test_float16_blocks_are_packed_weights_layout():
    w = np.random.default_rng(0).standard_normal((96, 192)).astype(np.float16)  # (in K, out N)
    assert np.array_equal(kernel_ab.packed_f16(w), packed_weights.block(w))


def test_int8_blocks_are_draft_weights_layout():
    q = np.random.default_rng(1).integers(-127, 128, (96, 192), dtype=np.int8)  # (in K, out N)
    assert np.array_equal(kernel_ab.packed_i8(q), draft_weights.to_blocks(q.T))
