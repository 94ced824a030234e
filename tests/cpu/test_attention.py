"""Lean attention (mlxspec/cpu/attention.py): attention with the kernel's
softmax computes what MLX computes (to float32 rounding), scores each
row of a block exactly as that row alone (what verify passes and trees rely on),
falls back to mlx-lm's own for what it does not take, and is installed for the
registered model types."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base

import mlxspec
import tiny_models
from mlxspec.cpu import attention as lean_attention, layers as lean_ops, kernel as small_gemm

pytestmark = pytest.mark.skipif(not small_gemm.loaded() or not lean_ops.wanted(),
                                reason="the kernel is not loaded or lean layers are off")


def qkv(L, T, n_q=6, n_kv=2, d=32, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    return f(1, n_q, L, d), f(1, n_kv, T, d), f(1, n_kv, T, d)


@pytest.mark.parametrize("mask", [None, "causal", "bool", "additive"])
@pytest.mark.parametrize("n_q,n_kv", [(6, 2), (4, 4)])
def test_attention_matches_mlx(mask, n_q, n_kv):
    L, T = (1 if mask is None else 5), 40
    q, k, v = qkv(L, T, n_q, n_kv)
    m = mask
    if mask == "bool":
        m = mx.array(np.random.default_rng(1).random((L, T)) < 0.7) | mx.array(np.eye(L, T, T - L, dtype=bool))
    elif mask == "additive":
        m = mx.array(np.random.default_rng(2).standard_normal((L, T)).astype(np.float32))
    got = lean_attention.lean_attention(q, k, v, None, 0.17, m)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.17, mask=m)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)


def test_each_row_is_computed_as_it_would_be_alone():
    """A block of positions scores each exactly as that position alone, with its own
    mask row: the products, the masking and the softmax are all row by row."""
    L, T = 9, 70
    q, k, v = qkv(L, T, seed=3)
    mask = mx.array(np.tril(np.ones((L, T), dtype=bool), T - L))
    together = np.array(lean_attention.lean_attention(q, k, v, None, 0.2, mask))
    for i in range(L):
        alone = np.array(lean_attention.lean_attention(q[:, :, i:i + 1], k, v, None, 0.2, mask[i:i + 1]))
        assert np.array_equal(together[:, :, i:i + 1], alone), f"row {i} differs"


def test_what_it_does_not_take_is_mlx_lms():
    q, k, v = qkv(3, 20)
    sinks = mx.zeros((6,))
    for args in [(q, k, v, None, 0.3, "causal", sinks), (q.astype(mx.float16), k.astype(mx.float16),
                                                         v.astype(mx.float16), None, 0.3, "causal")]:
        got = lean_attention.lean_attention(*args)
        want = base.scaled_dot_product_attention(*args[:3], cache=None, scale=0.3, mask="causal",
                                                 sinks=args[6] if len(args) > 6 else None)
        assert np.array_equal(np.array(got), np.array(want))
    old = lean_attention.set_attention(False)
    try:
        assert np.array_equal(np.array(lean_attention.lean_attention(q, k, v, None, 0.3, "causal")),
                              np.array(base.scaled_dot_product_attention(q, k, v, None, 0.3, "causal")))
    finally:
        lean_attention.set_attention(old)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_installed_for_registered_model_types_and_close_to_mlx(arch):
    cfg = tiny_models.config_for(arch, vocab_size=64)
    if arch == "qwen3":
        cfg["head_dim"] = 16
    model = tiny_models.build(cfg, seed=4, scale=3.0)
    assert lean_ops.prepare(model).get("attention") == 1
    assert "attention" in lean_ops.applied(model)
    module = __import__(type(model).__module__, fromlist=["x"])
    assert module.scaled_dot_product_attention is lean_attention.lean_attention
    ids = mx.array([[1, 5, 9, 33, 2, 7, 40, 41, 12, 4]])
    lean = np.array(model(ids))
    old = lean_attention.set_attention(False)
    try:
        assert "attention" not in lean_ops.applied(model)
        np.testing.assert_allclose(lean, np.array(model(ids)), rtol=1e-4, atol=1e-4)
    finally:
        lean_attention.set_attention(old)


def test_greedy_speculative_equals_plain_with_lean_attention(tmp_path):
    pair = mlxspec.load(tiny_models.f16_model_dir(tmp_path / "t", "qwen2"),
                        tiny_models.f16_model_dir(tmp_path / "d", "qwen2", noise=0.01, seed=1))
    assert "attention" in lean_ops.applied(pair.target)
    for prompt in ("w1 w2 w3 w4", "w7 w7 w7 w7 w9"):
        plain = mlxspec.generate(pair, prompt, drafter="none", max_tokens=24, chat_template=False).tokens
        for tree in (True, False):
            spec = mlxspec.generate(pair, prompt, max_tokens=24, chat_template=False, tree=tree, num_draft=4)
            assert spec.tokens == plain


@pytest.mark.parametrize("n_q,n_kv", [(14, 2), (12, 2), (6, 2), (4, 4)])
@pytest.mark.parametrize("mask", [None, "causal", "bool", "additive"])
def test_heads_scored_together_give_the_same_bits_as_one_by_one(monkeypatch, n_q, n_kv, mask):
    """Query heads sharing a key head are scored by one product where the kernel takes
    its rows (heads_per_product): every output bit for bit what a product per head gives,
    for blocks from a plain step's one position to a verify pass's many."""
    for L in (1, 2, 3, 5, 6, 8, 11, 16, 33):
        q, k, v = qkv(L, 60, n_q, n_kv, seed=L)
        rng = np.random.default_rng(L)
        m = {"bool": mx.array(rng.random((L, 60)) < 0.6) | mx.array(np.eye(L, 60, 60 - L, dtype=bool)),
             "additive": mx.array(rng.standard_normal((L, 60)).astype(np.float32))}.get(mask, mask)
        if mask is None and L > 1:
            continue
        grouped = np.array(lean_attention.lean_attention(q, k, v, None, 0.2, m))
        with monkeypatch.context() as mp:
            mp.setattr(lean_attention, "heads_per_product", lambda rep, L: 1)
            alone = np.array(lean_attention.lean_attention(q, k, v, None, 0.2, m))
        assert np.array_equal(grouped, alone), f"L={L}"


def test_heads_per_product_fills_the_kernels_rows():
    limit = small_gemm.max_rows()
    assert lean_attention.heads_per_product(7, 1) == 7
    assert lean_attention.heads_per_product(6, 5) == 6 and 6 * 5 <= limit
    assert lean_attention.heads_per_product(6, 8) == 3  # 24 rows; all 6 would be 48
    assert lean_attention.heads_per_product(7, 5) == 1  # 35 rows: the per-head products
    assert lean_attention.heads_per_product(1, 1) == 1
    old = small_gemm.set_enabled(False)
    try:
        assert lean_attention.heads_per_product(7, 1) == 1  # OpenBLAS takes the products: shapes kept
    finally:
        small_gemm.set_enabled(old)
