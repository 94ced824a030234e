"""benchmarks/every_width.py: the format-6 reading of a calibration it compares against."""

import pytest

from bench_util import load_benchmark
from mlxspec import calibration_cache
from mlxspec.cost_model import CostModel


def load_script():
    return load_benchmark("every_width")


def test_importing_it_changes_nothing():
    before = calibration_cache.for_decoder
    load_script()
    assert calibration_cache.for_decoder is before  # it switches the lookup in main() only


def test_interpolated_keeps_format_6_widths_and_draws_lines_between():
    ew = load_script()
    steps = [1.0 + 0.9 * ((w - 1) // 6) + 0.02 * (w - 1) for w in range(1, 33)]
    drafts = [1.0 + 0.5 * (w - 1) + (0.3 if w == 5 else 0.0) for w in range(1, 17)]
    cm = ew.interpolated(CostModel(0.25, steps, 0.1, "measured", drafts))
    for w in ew.FORMAT_6_WIDTHS:
        assert cm.verify[w - 1] == pytest.approx(steps[w - 1], abs=0.005)
    assert cm.verify[6] == pytest.approx((steps[5] + steps[7]) / 2, abs=0.01)  # 7: between 6 and 8, not its step
    assert cm.verify[6] < steps[6] - 0.3
    assert cm.draft_widths[4] == pytest.approx((drafts[3] + drafts[5]) / 2, abs=0.01)  # 5 was not timed in format 6
    assert cm.draft_step == 0.25 and len(cm.verify) == 32 and len(cm.draft_widths) == 16
