"""int8 draft weights (cpu/draft_weights.py, cpu/draft_gemm.c): the layout round-trips, the
kernel computes exactly the documented rounding (weights per column, activations per
block of 32) for 1-40 rows, a row does not depend on the rows beside it, a malformed
call is loud; a loaded pair rounds the draft and never the target, and its greedy
output (trees and chains) equals plain decoding; sampled output follows the target's
exact sequence distribution even with a draft rounded to three levels, and the same
test fails when q is reported from the unrounded draft."""

import collections
import re

import mlx.core as mx
import numpy as np
import pytest

import mlxspec
import tiny_models
from mlxspec.cpu import draft_weights, packed_weights, kernel as small_gemm
from mlxspec.cpu.draft_weights import Int8Linear
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.cpu.packed_weights import PackedLinear
from mlxspec.core.sampling import process_logits
from stats_util import chi_square
from test_sequence_distribution import OTHER_PARAMS, exact_sequence_probs, sample_sequences

# 600 samples (the sequence tests' 1000 are more than these need): the unrounded-q control fails at
# p = 0 (chi2 2793, df 29; threshold 1e-3) and a broken residual step at 8.6e-11 (5e-3 at 400);
# the rounded draft passes at p = 0.56 (0.75 at 1000)
SAMPLES = 600

# skipped only where the kernel cannot be built for int8 (neither AVX-512 VNNI nor AVX2); a kernel that is
# built but computes wrongly fails here (works would keep it from ever being used)
pytestmark = pytest.mark.skipif(not packed_weights.available()
                                or not small_gemm.formats() & packed_weights.FORMAT_BIT["i8"],
                                reason="no int8 kernel (needs AVX-512 VNNI or AVX2)")


def test_the_kernel_passes_its_own_check():
    assert draft_weights.works()


def rows_and_weight(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 3] *= 40.0  # an outlier channel: its block gets its own scale
    return x, rng.standard_normal((n, k)).astype(np.float32)


@pytest.mark.parametrize("n", [64, 200, 7])
def test_blocks_round_trip(n):
    q = np.random.default_rng(0).integers(-127, 128, size=(n, 96)).astype(np.int8)
    assert np.array_equal(draft_weights.from_blocks(draft_weights.to_blocks(q), 96, n), q)


def test_quantise_rounds_each_column_to_its_own_scale():
    w = np.random.default_rng(0).standard_normal((50, 64)).astype(np.float32) * np.arange(1, 51)[:, None]
    q, s = draft_weights.quantise(w)
    assert np.abs(q).max() == 127 and (np.abs(q).max(axis=1) == 127).all()
    assert (np.abs(q * s[:, None] - w) <= s[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 9, 33, 40])
@pytest.mark.parametrize("n", [64, 200])
def test_products_are_the_documented_rounding(m, n):
    x, w = rows_and_weight(m, 160, n)
    layer = Int8Linear.from_rows(w)
    q, s = draft_weights.quantise(w)
    want = draft_weights.reference(x, q, s)
    got = np.array(layer(mx.array(x)))
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(got - x @ w.T).max() < 0.05 * np.abs(x @ w.T).max()  # and near the unrounded product


def test_a_row_does_not_depend_on_its_neighbours():
    x, w = rows_and_weight(9, 128, 200)
    layer = Int8Linear.from_rows(w)
    together = np.array(layer(mx.array(x)))
    for i in range(9):
        assert np.array_equal(np.array(layer(mx.array(x[i]))), together[i])


@pytest.mark.skipif(small_gemm.set_draft_amx(True) is None, reason="no AMX tiles here")
@pytest.mark.parametrize("m", [3, 4, 16, 17, 40])
def test_amx_tiles_give_the_vnni_products_bit_for_bit(m):
    """Products over AMX_MIN_ROWS+ rows run on AMX tiles: the same integer sums and the
    same float steps, so exactly the VNNI code's result (a draft's tokens do not depend
    on which unit computed them)."""
    x, w = rows_and_weight(m, 160, 200, seed=m)
    layer = Int8Linear.from_rows(w)
    try:
        small_gemm.set_draft_amx(False)
        vnni = np.array(layer(mx.array(x)))
        small_gemm.set_draft_amx(True)
        tiles = np.array(layer(mx.array(x)))
    finally:
        small_gemm.set_draft_amx(True)
    assert np.array_equal(tiles, vnni)
    assert np.allclose(tiles, draft_weights.reference(x, *draft_weights.quantise(w)), rtol=1e-5, atol=1e-5)


def test_bias_leading_dims_and_take_columns():
    x, w = rows_and_weight(6, 64, 300)
    bias = mx.array(np.arange(300, dtype=np.float32))
    layer = Int8Linear.from_rows(w, bias)
    flat = np.array(Int8Linear.from_rows(w)(mx.array(x)))
    got = np.array(layer(mx.array(x.reshape(2, 3, 64))))
    assert got.shape == (2, 3, 300) and np.array_equal(got.reshape(6, 300), flat + np.arange(300, dtype=np.float32))
    ids = np.array([0, 5, 63, 64, 130, 255, 256, 299])  # full blocks and the narrow last one
    sub = layer.take_columns(ids)
    assert np.array_equal(np.array(sub(mx.array(x))), flat[:, ids])
    assert np.array_equal(np.array(sub.wt()), np.array(layer.wt())[:, ids])


@pytest.mark.parametrize("n", [200, 64, 9728, 7])
def test_one_row_goes_as_pairs_and_gives_the_four_row_calls_bits(n):
    """A draft step's single row is passed as (2, K/2) against the same bytes seen as (K/2, N/2),
    C the scales as stored: bit for bit what the (4, K/4) call gives, with a bias and with any
    leading dimensions; an odd N keeps the (4, K/4) call."""
    x, w = rows_and_weight(1, 96, n, seed=n)
    bias = mx.array(np.linspace(-1, 1, n, dtype=np.float32))
    for layer in (Int8Linear.from_rows(w), Int8Linear.from_rows(w, bias)):
        assert (layer._row is None) == (n % 2 == 1)
        four_rows = np.array(PackedLinear.__call__(layer, mx.array(x)))  # the (4M, K/4) call
        for shape in ((96,), (1, 96), (1, 1, 96)):
            got = layer(mx.array(x.reshape(shape)))
            assert got.shape == shape[:-1] + (n,) and np.array_equal(np.array(got).reshape(1, n), four_rows)
    if layer._row is not None:  # views of the weight's own memory, not copies
        packed, pairs, c = layer._row
        assert np.shares_memory(np.asarray(memoryview(pairs)), np.asarray(memoryview(packed)))
        assert np.shares_memory(np.asarray(memoryview(c)), np.asarray(memoryview(layer.scales)))


def test_a_one_row_product_is_three_operations(tmp_path):
    """What the pairs call is for: a step of the default draft makes 97 of these products, and each
    operation costs dispatch time (the (4, K/4) call made five: a broadcast of the scales, a
    slice of the first row and the reshapes)."""
    x, w = rows_and_weight(1, 64, 128)
    layer = Int8Linear.from_rows(w)
    out = layer(mx.array(x.reshape(1, 1, 64)))
    mx.export_to_dot(str(tmp_path / "g.dot"), out)
    ops = collections.Counter(re.findall(r'label ="([A-Za-z_0-9]+)', (tmp_path / "g.dot").read_text()))
    assert ops == {"Reshape": 2, "AddMM": 1}, ops


@pytest.mark.parametrize("rows, beta", [(3, 1.0), (2, 0.0)])
def test_a_malformed_pairs_call_is_nan(rows, beta):
    layer = Int8Linear.from_rows(rows_and_weight(1, 64, 64)[1])
    a = mx.array(np.ones((rows, 32), dtype=np.float32))  # pairs calls come with 2M rows
    c = mx.zeros((rows, 32)) + 1.0
    out = mx.addmm(c, a, layer._row[1], alpha=draft_weights.PAIRS_ALPHA, beta=beta)
    assert np.isnan(np.array(out)).all()


def test_a_malformed_call_is_nan_not_silently_wrong():
    layer = Int8Linear.from_rows(rows_and_weight(1, 64, 64)[1])
    odd_rows = mx.array(np.ones((3, 16), dtype=np.float32))  # int8 calls come with 4M rows
    out = mx.addmm(layer.scales, odd_rows, layer.packed, alpha=layer._alpha, beta=1.0)
    assert np.isnan(np.array(out)).all()


def test_a_loaded_pair_rounds_the_draft_only_and_greedy_output_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv(draft_weights.BITS_ENV, "8")  # int8 only (4-bit: cpu/test_draft_weights4.py)
    target = tiny_models.f16_model_dir(tmp_path / "t", "qwen2")
    draft_dir = tiny_models.f16_model_dir(tmp_path / "d", "qwen2", noise=0.01, seed=1)
    pair = mlxspec.load(target, draft_dir)
    layers = [m for _, m in pair.draft.named_modules() if isinstance(m, PackedLinear)]
    assert layers and all(isinstance(m, Int8Linear) for m in layers)
    assert not any(isinstance(m, Int8Linear) for _, m in pair.target.named_modules())
    assert packed_weights.layout(pair.draft) == "packed i8" and packed_weights.layout(pair.target) == "packed f16"
    tiny_models.check_greedy_packed_pair(pair)


def test_turned_off_by_environment(tmp_path, monkeypatch):
    target = tiny_models.f16_model_dir(tmp_path / "t", "qwen2")
    draft_dir = tiny_models.f16_model_dir(tmp_path / "d", "qwen2", noise=0.01, seed=1)
    monkeypatch.setenv(draft_weights.ENV, "0")
    assert packed_weights.layout(mlxspec.load(target, draft_dir).draft) == "packed f16"


@pytest.fixture(scope="module")
def coarse():
    """(target, exact draft, the same draft rounded to three levels per column: q in {-1, 0, 1})."""
    cfg = tiny_models.config_for("llama", vocab_size=8, hidden=32, ffn=64)
    target = tiny_models.build(cfg, seed=3, scale=1.5)
    exact, rounded = tiny_models.build(cfg, seed=4, scale=1.5), tiny_models.build(cfg, seed=4, scale=1.5)
    old, draft_weights.QMAX = draft_weights.QMAX, 1
    mp = pytest.MonkeyPatch()
    mp.setenv(draft_weights.BITS_ENV, "8")  # int8 only: QMAX is int8's
    try:
        assert draft_weights.prepare(rounded) > 0
    finally:
        draft_weights.QMAX = old
        mp.undo()
    return target, exact, rounded


def test_a_rounded_draft_keeps_the_target_distribution(coarse):
    target, _, rounded = coarse
    probs = exact_sequence_probs(target, OTHER_PARAMS)
    counts, accepted = sample_sequences(target, rounded, OTHER_PARAMS, samples=SAMPLES)
    assert accepted > SAMPLES // 4
    stat, df, pval = chi_square(counts, probs, SAMPLES)
    print(f"rounded draft: chi2={stat:.1f} df={df} p={pval:.3g} accepted={accepted}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


class ReportsUnroundedQ(ModelDrafter):
    """The control: tokens drawn from the rounded draft, q reported from the exact one."""

    def __init__(self, rounded, exact):
        super().__init__(rounded)
        self.exact = exact

    def propose(self, history, k, params, key, rnd=None):
        prop = super().propose(history, k, params, key, rnd)
        if prop.q is not None and len(prop.tokens):
            seq = list(history) + list(prop.tokens)
            n = len(history)
            logits = self.exact(mx.array(seq)[None])[0, n - 1: n - 1 + len(prop.tokens)]
            lp = process_logits(logits, params, [seq[: n + i] for i in range(len(prop.tokens))])
            prop.q = mx.exp(lp)
        return prop


def test_chi_square_fails_when_q_comes_from_the_unrounded_draft(coarse):
    target, exact, rounded = coarse
    probs = exact_sequence_probs(target, OTHER_PARAMS)
    counts, _ = sample_sequences(target, ReportsUnroundedQ(rounded, exact), OTHER_PARAMS, samples=SAMPLES)
    stat, df, pval = chi_square(counts, probs, SAMPLES)
    print(f"q from the unrounded draft: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval < 1e-3, f"q from the unrounded draft went unnoticed: chi2={stat:.1f} df={df} p={pval:.2e}"
