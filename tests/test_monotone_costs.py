"""Verify costs that never fall with width where the small-batch kernel runs the
products (costs/verify_curve.py): a dip in a calibration is noise there, and must not be
a price (padding 2-position passes to 3, a free third position for a sibling)."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from mlxspec.costs import calibration as calibration_cache
from mlxspec.cpu import kernel as small_gemm
from mlxspec.costs.cost_model import CostModel
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.costs.verify_curve import as_used, isotonic, monotone

# the EPYC's cached calibration of stop 39 (format 6), first ten widths: 3 positions "cheaper" than 2
EPYC = [1.0, 1.08, 1.0, 1.19, 1.3, 1.41, 1.57, 1.74, 1.94, 2.14]


def min_max_fit(v: list[float]) -> list[float]:
    """The least-squares non-decreasing fit by its closed form (Barlow et al.): at i, the
    largest over j <= i of the smallest over k >= i of mean(v[j..k])."""
    n = len(v)
    return [max(min(sum(v[j:k + 1]) / (k + 1 - j) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]


costs = st.lists(st.floats(0.5, 4.0, allow_nan=False), min_size=1, max_size=24)


@settings(max_examples=200, deadline=None)
@given(v=costs)
def test_isotonic_is_the_least_squares_non_decreasing_fit(v):
    got = isotonic(v)
    assert len(got) == len(v)
    assert all(b >= a for a, b in zip(got, got[1:]))
    assert got == pytest.approx(min_max_fit(v), abs=1e-3)
    assert sum(got) == pytest.approx(sum(v), abs=1e-3 * len(v))  # pooling keeps each run's mean


@settings(max_examples=100, deadline=None)
@given(v=costs)
def test_a_curve_that_never_falls_is_left_as_it_is(v):
    rising = sorted(v)
    assert isotonic(rising) == pytest.approx(rising, abs=1e-4)
    cm = CostModel(0.3, [1.0] + [max(1.0, x) for x in rising], 0.1, "measured")
    assert monotone(cm) is cm


@settings(max_examples=200, deadline=None)
@given(v=costs)
def test_monotone_costs_start_at_one_never_fall_and_never_pad(v):
    cm = CostModel(0.3, [1.0] + v, 0.1, "cached")
    used = monotone(cm)
    assert used.verify[0] == 1.0 and len(used.verify) == len(cm.verify)
    assert all(b >= a for a, b in zip(used.verify, used.verify[1:]))
    assert all(used.pad_width(w) == w for w in range(1, len(used.verify) + 3))
    assert [used.verify_width(w) for w in range(1, len(v) + 2)] == used.verify


def test_the_epyc_dip_is_pooled_and_no_longer_pads():
    cm = CostModel(0.26, list(EPYC), 0.0917, "cached")
    assert cm.pad_width(2) == 3 and cm.extra(2) == 0.0 and cm.extra(3) == 0.0  # as measured: two free positions
    used = monotone(cm)
    assert used.verify[:4] == pytest.approx([1.0, 1.04, 1.04, 1.19])
    assert used.verify[3:] == EPYC[3:]
    assert used.pad_width(2) == 2 and used.extra(2) == pytest.approx(0.04)
    assert used.monotone and not cm.monotone and used.source == "cached" and "made monotone" in used.describe()
    assert cm.verify == EPYC  # the measured figures are not touched


def test_a_dip_below_a_plain_step_pools_to_a_plain_step():
    used = monotone(CostModel(0.3, [1.0, 0.9, 0.95, 1.3], 0.1, "measured"))
    assert used.verify == [1.0, 1.0, 1.0, 1.3]


@pytest.mark.linux_cpu  # the small-batch kernel switched off (cpu/kernel.py)
def test_without_the_kernel_a_dip_is_a_price():
    """OpenBLAS's 16-row products can cost less than 5- to 15-row ones (test_padded_passes.py)."""
    cm = CostModel(0.35, [1.0, 1.21, 1.45, 1.66, 1.7, 1.75, 1.8, 1.8, 1.9, 2.0, 2.3, 2.67, 2.5, 2.2, 1.9, 1.57], 0.5,
                   "measured")
    old = small_gemm.set_enabled(False)
    try:
        assert as_used(cm) is cm and cm.pad_width(5) == 16
    finally:
        small_gemm.set_enabled(old)


@pytest.mark.linux_cpu
@pytest.mark.skipif(not small_gemm.loaded(), reason="the small-batch kernel did not build here")
def test_for_decoder_decides_by_the_monotone_curve_and_the_cache_keeps_the_measured_one(tmp_path, monkeypatch,
                                                                                          smollm2_pair):
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    drafter = SimpleNamespace(uses_draft_model=True, name=ModelDrafter.name)
    old = small_gemm.set_enabled(True)
    try:
        key = calibration_cache.cache_key(smollm2_pair, drafter)
        calibration_cache.save(key, CostModel(0.26, list(EPYC), 0.0917, "measured"))
        used = calibration_cache.for_decoder(smollm2_pair, drafter, say=None)
        assert used.verify[:4] == pytest.approx([1.0, 1.04, 1.04, 1.19]) and used.pad_width(2) == 2
        assert calibration_cache.load_cached(key).verify == EPYC  # the file as measured
        small_gemm.set_enabled(False)  # calibrations are keyed by the kernel's state (backend.describe)
        calibration_cache.save(calibration_cache.cache_key(smollm2_pair, drafter),
                               CostModel(0.26, list(EPYC), 0.0917, "measured"))
        raw = calibration_cache.for_decoder(smollm2_pair, drafter, say=None)
        assert raw.verify == EPYC and raw.pad_width(2) == 3
    finally:
        small_gemm.set_enabled(old)
