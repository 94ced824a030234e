"""Calibration on Metal (issue 58 part 6), decided from injected timings (no clock): the
minimum of the repeats per width, a verify curve that falls only where the dip
reproduces across repeats (costs/verify_curve.dips_reproduce), synchronised passes, and
one line when the repeats spread widely where no /proc load figure exists."""

from types import SimpleNamespace

import pytest

from mlxspec.costs import calibration, cost_model, machine_load, verify_curve
from mlxspec.costs.cost_model import CostModel, from_times
from mlxspec.costs.verify_curve import as_used, dips_reproduce, spread_warning


@pytest.fixture(autouse=True)
def no_kernel(monkeypatch):
    monkeypatch.setattr(verify_curve, "kernel_is_monotone", lambda: False)  # as on a Mac


def test_metal_takes_the_minimum_of_the_repeats_cpu_the_median():
    times = {1: [1.0, 1.3, 4.0], 2: [1.1, 1.6, 1.5]}
    assert from_times(times, metal=True).verify == [1.0, 1.1]
    assert from_times(times).verify == [1.0, 1.15]  # median 1.5 / 1.3
    assert from_times(times).dips_real is None and from_times(times).spread is None


def test_a_dip_seen_once_is_noise_and_the_curve_is_used_monotone_on_metal():
    times = {1: [1.0, 1.0, 1.0], 2: [1.2, 1.2, 1.21], 3: [1.05, 1.3, 1.31], 4: [1.4, 1.4, 1.41]}
    cm = from_times(times, metal=True)
    assert cm.verify[:3] == [1.0, 1.2, 1.05] and cm.dips_real is False  # the file keeps it as measured
    used = as_used(cm, gpu=True)
    assert all(b >= a for a, b in zip(used.verify, used.verify[1:])) and used.monotone
    assert as_used(cm, gpu=False) is cm  # the CPU backend without the kernel: as measured, as before


def test_a_dip_measured_in_every_repeat_is_a_price_on_metal():
    times = {1: [1.0, 1.0, 1.0], 2: [1.2, 1.2, 1.21], 3: [1.05, 1.06, 1.1], 4: [1.4, 1.4, 1.41]}
    cm = from_times(times, metal=True)
    assert cm.dips_real is True
    assert as_used(cm, gpu=True) is cm and cm.verify[2] < cm.verify[1]


def test_dips_reproduce_rule():
    assert dips_reproduce({1: [1.0], 2: [1.2, 1.3]})  # no dip
    assert dips_reproduce({1: [1.0, 1.0], 2: [2.0, 2.1, 2.2], 3: [1.5, 1.9, 1.6]})  # every 3 below 2's median 2.1
    assert not dips_reproduce({1: [1.0, 1.0], 2: [2.0, 2.1, 2.2], 3: [1.5, 2.5, 1.6]})


def test_a_calibration_cached_without_the_judgement_is_used_monotone_on_metal(tmp_path):
    cm = CostModel(0.3, [1.0, 1.2, 1.05, 1.4])
    assert as_used(cm, gpu=True).verify == [1.0, 1.125, 1.125, 1.4]
    path = tmp_path / "c.json"
    path.write_text(__import__("json").dumps({"format": cost_model.FORMAT, **CostModel(0.3, [1.0, 1.2, 1.05], dips_real=True).to_dict()}))
    assert calibration.read(path).dips_real is True


def test_spread_warning_is_one_line_and_only_for_a_wide_spread():
    assert spread_warning(CostModel(0.3, spread=None)) is None
    assert spread_warning(CostModel(0.3, spread=1.1)) is None
    note = spread_warning(CostModel(0.3, spread=1.8))
    assert note and "\n" not in note and "1.80x" in note
    wide = from_times({1: [1.0, 2.0, 2.0], 2: [1.1, 2.2, 2.2]}, metal=True)
    assert wide.spread == 2.0


def _pair():
    return SimpleNamespace(vocab_size=100, target=None, target_config={})


@pytest.mark.parametrize("proc, warned", [(None, True), (123.0, False)])
def test_the_spread_is_said_only_where_there_is_no_load_figure(monkeypatch, tmp_path, proc, warned):
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    monkeypatch.setattr(machine_load, "machine_busy_seconds", lambda: proc)
    monkeypatch.setattr(calibration, "cache_key", lambda pair, drafter: None)
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: CostModel(0.3, [1.0, 1.1], spread=1.9, dips_real=True))
    said = []
    calibration.for_decoder(_pair(), SimpleNamespace(), say=said.append)
    assert any("spread widely" in s for s in said) == warned


def test_metal_passes_are_synchronised_and_judged(monkeypatch):
    """With the backend faked as Metal, calibrate drains the queue around every timed call
    and hands from_times metal=True."""
    import mlx.core as mx

    from tests.tiny_models import make_model
    from mlxspec import device

    calls = {"sync": 0}
    monkeypatch.setattr(device, "is_gpu", lambda: True)
    monkeypatch.setattr(mx, "synchronize", lambda *a: calls.__setitem__("sync", calls["sync"] + 1), raising=False)
    seen = {}
    real = cost_model.from_times

    def spy(times, rc=0.0, *, metal=False):
        seen["metal"] = metal
        return real(times, rc, metal=metal)

    monkeypatch.setattr(cost_model, "from_times", spy)
    cm = cost_model.calibrate(make_model(), SimpleNamespace(relative_cost=0.2), 300, widths=(1, 2, 3), repeats=2)
    assert seen["metal"] is True and calls["sync"] > 0 and cm.dips_real is not None and cm.spread is not None
