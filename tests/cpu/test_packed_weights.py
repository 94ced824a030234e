"""Packed weights (cpu/packed_weights.py, cpu/small_gemm.c's PACKED_* calls): the narrowest
exact format is chosen, products on packed weights equal the float32 kernel's bit
for bit (every format, edge shapes, 1-16 rows; more rows, in chunks, against
float64 and row by row), the kernel takes them even when switched off, a malformed
call is loud, and a loaded model is packed, computes what the unpacked one does,
and keeps greedy speculative output equal to plain decoding."""


import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlxspec
import tiny_models
from mlxspec import cpu
from mlxspec.cpu import blas_layout, packed_weights, kernel as small_gemm
from mlxspec.drafting import vocab_subset
from mlxspec.cpu.blas_layout import TransposedLinear
from mlxspec.cpu.packed_weights import PackedLinear

pytestmark = pytest.mark.skipif(not packed_weights.available(), reason="no small-batch kernel: nothing is packed")
FORMATS = ["f32", "f16", "bf16"]


def weights(k, n, fmt, seed=0):
    """A float32 (k, n) array whose values `fmt` holds exactly."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    if fmt == "f16":
        w = w.astype(np.float16).astype(np.float32)
    elif fmt == "bf16":
        w = (w.view(np.uint32) & 0xFFFF0000).view(np.float32) * np.float32(2.0 ** 20)  # beyond float16's range
    return w


def test_the_narrowest_exact_format_is_chosen(monkeypatch):
    assert packed_weights.choose_format(weights(8, 70, "f16")) == "f16"
    assert packed_weights.choose_format(weights(8, 70, "bf16")) == "bf16"
    assert packed_weights.choose_format(weights(8, 70, "f32")) == "f32"
    assert packed_weights.choose_format(weights(7, 70, "f16")) == "f32"  # 16-bit needs an even K
    assert packed_weights.choose_format(weights(8, 70, "f16"), narrow=False) == "f32"
    monkeypatch.setenv(packed_weights.ENV, "f32")
    assert packed_weights.choose_format(weights(8, 70, "f16")) == "f32"


@pytest.mark.parametrize("n", [64, 200, 5])
def test_blocks_round_trip(n):
    w = weights(9, n, "f32")
    flat = packed_weights.block(w)
    assert flat.shape == (9 * n,) and np.array_equal(packed_weights.unblock(flat, 9, n), w)
    if n >= 64:  # block 0 holds column 0..63 of every row, contiguously
        assert np.array_equal(flat[:64 * 9].reshape(9, 64), w[:, :64])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k,n", [(2, 1), (64, 64), (130, 200), (256, 7), (512, 1000)])
def test_products_equal_the_float32_kernel_bit_for_bit(fmt, k, n):
    w = weights(k, n, fmt, seed=k + n)
    packed = PackedLinear.from_weight(mx.array(w), None, fmt)
    assert packed.fmt == fmt and np.array_equal(np.array(packed.wt()), w)
    plain = mx.array(w)
    for m in (1, 2, 3, 5, 8, 9, 10, 11, 13, 16):
        x = mx.array(np.random.default_rng(m).standard_normal((1, m, k)).astype(np.float32))
        before = small_gemm.packed_calls()
        got, want = packed(x), x @ plain  # both in the kernel: the same order of terms
        mx.eval(got, want)
        assert small_gemm.packed_calls() == before + 1
        assert got.shape == (1, m, n) and np.array_equal(np.array(got), np.array(want)), (m, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [17, 33, 100])
def test_large_products_in_chunks_match_float64(fmt, m):
    k, n = 96, 300  # four full column blocks and a narrower one
    w = weights(k, n, fmt)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    linear = PackedLinear.from_weight(mx.array(w), None, fmt)
    got = np.array(linear(mx.array(x)))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    assert np.all(np.abs(got - ref) <= 1e-5 * scale + 1e-6)
    for i in (0, m - 1):  # a prompt's rows as each alone (a decode step)
        assert np.array_equal(got[i:i + 1], np.array(linear(mx.array(x[i:i + 1]))))


@pytest.mark.parametrize("fmt", FORMATS)
def test_bias_and_leading_dims(fmt):
    w, b = weights(64, 96, fmt), np.arange(96, dtype=np.float32)
    packed = PackedLinear.from_weight(mx.array(w), mx.array(b), fmt)
    x = np.random.default_rng(3).standard_normal((2, 3, 64)).astype(np.float32)
    got = np.array(packed(mx.array(x)))  # a batch of A: MLX folds it into the rows
    assert got.shape == (2, 3, 96)
    assert np.allclose(got, x @ w + b, rtol=1e-5, atol=1e-4)
    assert np.allclose(np.array(packed(mx.array(x[0, 0]))), x[0, 0] @ w + b, rtol=1e-5, atol=1e-4)  # 1-D


def test_packed_calls_reach_the_kernel_when_it_is_switched_off():
    w = weights(128, 128, "f16")
    packed = PackedLinear.from_weight(mx.array(w), None, "f16")
    x = mx.array(np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32))
    want = np.array(packed(x))
    old = small_gemm.set_enabled(False)
    try:
        got = np.array(packed(x))
    finally:
        small_gemm.set_enabled(old)
    assert np.array_equal(got, want)


def test_a_malformed_16_bit_call_is_nan_not_silently_wrong():
    w = weights(128, 64, "f16")
    packed = PackedLinear.from_weight(mx.array(w), None, "f16")
    odd_rows = mx.array(np.ones((3, 64), dtype=np.float32))  # 16-bit calls come with 2M rows
    out = mx.addmm(mx.array(0.0), odd_rows, packed.packed, alpha=packed._alpha, beta=0.0)
    assert np.isnan(np.array(out)).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_take_columns(fmt):
    w = weights(64, 300, fmt)
    packed = PackedLinear.from_weight(mx.array(w), None, fmt)
    ids = np.array([0, 5, 63, 64, 130, 255, 256, 299])  # full blocks and the narrow last one
    sub = packed.take_columns(ids)
    x = mx.array(np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32))
    assert sub.fmt == fmt and np.array_equal(np.array(sub.wt()), w[:, ids])
    assert np.array_equal(np.array(sub(x)), np.array(packed(x))[:, ids])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_loaded_model_is_packed_and_computes_what_the_unpacked_one_does(tmp_path, monkeypatch, arch):
    path = tiny_models.f16_model_dir(tmp_path / arch, arch)
    packed = mlxspec.load(path, no_draft=True).target
    monkeypatch.setenv(packed_weights.ENV, "0")
    plain = mlxspec.load(path, no_draft=True).target
    linears = [m for _, m in packed.named_modules() if isinstance(m, (nn.Linear, TransposedLinear))]
    assert not linears and cpu.layout(packed) == "packed f16" and cpu.layout(plain) == "blas"
    ids = mx.array([[1, 5, 9, 33, 2, 7, 80, 81, 12, 4]])  # one pass, at most 32 rows: the kernel, both
    assert np.array_equal(np.array(packed(ids)), np.array(plain(ids)))
    assert sum(v.nbytes for _, v in tree_flatten(packed.parameters())) < \
        0.6 * sum(v.nbytes for _, v in tree_flatten(plain.parameters()))


def test_greedy_speculative_equals_plain_on_a_packed_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_DRAFT_INT8", "0")  # the draft's 16-bit packing (int8: cpu/test_draft_weights.py)
    target = tiny_models.f16_model_dir(tmp_path / "t", "qwen2")
    draft_dir = tiny_models.f16_model_dir(tmp_path / "d", "qwen2", noise=0.01, seed=1)
    pair = mlxspec.load(target, draft_dir)
    assert cpu.layout(pair.draft) == "packed f16"
    tiny_models.check_greedy_packed_pair(pair)


def test_a_packed_draft_head_can_be_pruned(tmp_path):
    path = tiny_models.save_model_dir(tmp_path / "m", "qwen2", vocab_size=300)
    model = mlxspec.load(path, no_draft=True).target
    assert isinstance(model.lm_head, PackedLinear)
    head = vocab_subset.SubsetHead(model, list(range(0, 300, 3)), 300)
    x = mx.array([[4, 8, 15, 16]])
    assert np.array_equal(np.array(head.model(x)), np.array(model(x))[..., ::3])
    again = vocab_subset.SubsetHead(model, list(range(0, 300, 3)), 300)  # a new decoder: the rows are shared
    assert again.model.lm_head is head.model.lm_head
    assert again.include([3, 5, 7]) and again.model.lm_head.first is head.model.lm_head  # 5, 7: a small extra
    assert np.array(again.ids).tolist() == list(range(0, 300, 3)) + [5, 7]
    assert np.array_equal(np.array(again.model(x)), np.array(model(x))[..., np.array(again.ids)])


def test_turned_off_by_environment(tmp_path):
    assert tiny_models.loaded_elsewhere(tmp_path / "llama", {packed_weights.ENV: "0"},
                                        "from mlxspec import cpu; from mlxspec.cpu import packed_weights, blas_layout",
                                        "packed_weights.available(), cpu.layout(m)") == ["False", "blas"]