"""Kernel operations (mlxspec/cpu/kernel_ops.py): the kernel's SwiGLU is mlx-lm's bit
for bit; its softmax and log-softmax are MLX's to float32 rounding, row by row;
a malformed marked call is NaN; and each operation is used only when its check
holds (the controls make the check fail and see nothing replaced)."""

import mlx.core as mx
import numpy as np
import pytest

import tiny_models
from mlxspec.cpu import kernel_ops, attention as lean_attention, layers as lean_ops, kernel as small_gemm
from mlxspec.core import sampling

kernel_only = pytest.mark.skipif(not small_gemm.loaded() or not lean_ops.wanted(),
                                 reason="the kernel is not loaded or lean layers are off")
pytestmark = kernel_only


@pytest.mark.parametrize("shape", [(16,), (1, 1, 4864), (1, 5, 8960), (3, 7, 32)])
def test_kernel_swiglu_is_mlx_lms_bit_for_bit(shape):
    from mlx_lm.models.activations import swiglu

    rng = np.random.default_rng(len(shape))
    scale = np.exp(rng.uniform(-12, 5, size=shape))  # |gate| from 6e-6 to 150: both exp branches, both clamps
    gate = (rng.standard_normal(shape) * scale).astype(np.float32)
    gate.reshape(-1)[:8] = [0.0, -0.0, 88.0, -88.0, 88.5, -88.5, np.inf, -np.inf][:gate.size]
    up = rng.standard_normal(shape).astype(np.float32)
    got = np.array(kernel_ops.swiglu(mx.array(gate), mx.array(up)))
    want = np.array(swiglu(mx.array(gate), mx.array(up)))
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} of {got.size} differ, e.g. gate {gate[~same][:3]}"
    assert kernel_ops.usable("swiglu")


def test_a_malformed_swiglu_call_is_nan_not_silently_wrong():
    rows = mx.array(np.ones((4, 8), dtype=np.float32))  # 8 wide, not SWIGLU_WIDTH
    out = mx.addmm(rows, rows, mx.zeros((8, 8)), alpha=kernel_ops.ALPHA["swiglu"], beta=1.0)
    assert np.isnan(np.array(out)).all()


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 15), (4, 16), (7, 100), (40, 1000)])
def test_softmax_matches_mlx(rows, n):
    x = np.random.default_rng(n).standard_normal((rows, n)).astype(np.float32) * 20
    x[0, : n // 2] = np.finfo(np.float32).min  # masked positions, as mlx-lm masks them
    got = np.array(kernel_ops.softmax(mx.array(x)))
    want = np.array(mx.softmax(mx.array(x), axis=-1, precise=True))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-8)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 7, 300), (1, 2, 2, 3, 40), (1, 14, 1, 65), (6, 5, 40), (3, 1, 2, 9)])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_row_wise_ops_over_a_few_matrices_are_the_one_matrix_call_bit_for_bit(shape, op):
    """Up to BATCHED_MATRICES matrices (attention's scores per key head) go to the kernel as
    they are, one call each, with no reshapes around it; every row bit for bit what the
    same rows give as one (rows, n) matrix."""
    x = mx.array((np.random.default_rng(len(shape)).standard_normal(shape) * 20).astype(np.float32))
    fn = getattr(kernel_ops, op)
    got = np.array(fn(x))
    want = np.array(fn(x.reshape(-1, shape[-1]))).reshape(shape)
    assert got.shape == tuple(shape) and np.array_equal(got, want)


def test_the_row_wise_operands_kept_are_bounded_and_right_past_the_bound():
    """The never-read operands made once per shape are kept for the last OPERANDS_KEPT keys
    only; a call whose own operands push out the oldest still gets both of them."""
    for n in range(1, kernel_ops.OPERANDS_KEPT + 9):
        x = mx.array(np.random.default_rng(n).standard_normal((2, 3, n)).astype(np.float32))
        got = np.array(kernel_ops.softmax(x))
        assert np.array_equal(got, np.array(kernel_ops.softmax(x.reshape(-1, n))).reshape(2, 3, n))
        assert len(kernel_ops._OPERANDS) <= kernel_ops.OPERANDS_KEPT


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 15), (2, 65536), (5, 151936)])
def test_log_softmax_matches_mlx_and_is_used_to_normalise(rows, n):
    x = (np.random.default_rng(n).standard_normal((rows, n)) * 8 + 12).astype(np.float32)
    x[0, : n // 3] = -np.inf  # masked by top-k / top-p
    want = np.array(mx.array(x) - mx.logsumexp(mx.array(x), axis=-1, keepdims=True))
    for got in (np.array(kernel_ops.log_softmax(mx.array(x))), np.array(sampling.normalise(mx.array(x)))):
        finite = np.isfinite(want)
        assert np.array_equal(finite, np.isfinite(got))
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=2e-5)
    alone = np.array(kernel_ops.log_softmax(mx.array(x[-1:])))
    assert np.array_equal(np.array(kernel_ops.log_softmax(mx.array(x)))[-1:], alone)  # row by row


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 15), (2, 65536), (3, 151936)])
def test_probabilities_are_exp_of_processed_rows_by_the_kernel(rows, n, monkeypatch):
    """Sampled rounds exponentiate whole rows of log-probabilities (the draft's q, the target's p):
    the kernel's softmax of them is their exp to float32 rounding, with exact zeros where
    top-k / top-p ruled a token out, and the kernel does it (not MLX's exp)."""
    x = (np.random.default_rng(n).standard_normal((rows, n)) * 6).astype(np.float32)
    x[0, : n // 3] = -np.inf
    lp = sampling.normalise(mx.array(x))
    want = np.array(mx.exp(lp))
    exps = []
    monkeypatch.setattr(mx, "exp", lambda a, *k, **kw: exps.append(a) or mx.sqrt(a))  # MLX's exp is not used
    got = np.array(kernel_ops.probabilities(lp))
    assert not exps
    assert np.array_equal(got == 0, want == 0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)


def test_probabilities_keep_mlx_for_other_dtypes():
    lp = mx.log(mx.array([[0.25, 0.75]], dtype=mx.float16))
    assert np.array_equal(np.array(kernel_ops.probabilities(lp)), np.array(mx.exp(lp)))


def test_normalise_keeps_mlx_for_other_dtypes():
    x = mx.array(np.random.default_rng(0).standard_normal((2, 40)).astype(np.float16))
    assert np.array_equal(np.array(kernel_ops.normalise(x)), np.array(x - mx.logsumexp(x, axis=-1, keepdims=True)))


@pytest.mark.parametrize("op", list(kernel_ops.BITS))
def test_a_check_fails_when_the_call_is_not_the_kernels(op, monkeypatch):
    """The guard of each operation fails when its marked call is not the kernel's (here:
    an unmarked alpha, a plain product), and then nothing uses it."""
    monkeypatch.setitem(kernel_ops.ALPHA, op, 1.0)
    monkeypatch.setattr(kernel_ops, "_checked", {})
    assert not kernel_ops.usable(op)
    model = tiny_models.build(tiny_models.config_for("qwen2", vocab_size=64), seed=3)
    counts = lean_ops.prepare(model)
    if op == "swiglu":
        assert "mlp" not in counts and "mlp" not in lean_ops.applied(model)
    if op == "softmax":
        assert not lean_attention.install(model)
    if op == "log_softmax":
        x = mx.array(np.random.default_rng(0).standard_normal((2, 40)).astype(np.float32))
        assert np.array_equal(np.array(kernel_ops.normalise(x)),
                              np.array(x - mx.logsumexp(x, axis=-1, keepdims=True)))


def test_a_malformed_softmax_call_is_nan_not_silently_wrong():
    x = mx.ones((3, 8))
    out = mx.addmm(x, mx.zeros((3, 2)), mx.zeros((2, 8)), alpha=kernel_ops.ALPHA["softmax"], beta=1.0)  # K = 2
    assert np.isnan(np.array(out)).all()
