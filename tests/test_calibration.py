"""The calibrated cost model: measured once per machine and pair, cached, reused;
a damaged cache file is ignored with a warning and measured again; seeded runs
give the same tokens when the calibration comes from the cache."""

import json
import os
import subprocess
import sys

import pytest

import mlxspec
from mlxspec.core.cache import ModelState
from mlxspec.costs import cost_model
from mlxspec.api import make_decoder


@pytest.fixture
def calib_dir(tmp_path, monkeypatch):
    d = tmp_path / "calibration"
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(d))
    return d


def test_measured_once_then_cached(tiny_pair, calib_dir, capsys):
    first = make_decoder(tiny_pair).policy.cost
    assert first.source == "measured"
    assert "calibrating" in capsys.readouterr().err
    files = list(calib_dir.glob("*.json"))
    assert len(files) == 1
    second = make_decoder(tiny_pair).policy.cost
    assert second.source == "cached" and capsys.readouterr().err == ""
    assert (second.draft_step, second.verify) == (first.draft_step, first.verify)
    # what was measured makes sense: relative to one position, never below it; the cost of
    # w positions (padded where a wider pass is cheaper) never falls as w grows
    v = first.verify
    assert v[0] == 1.0 and min(v) >= 1.0 and first.draft_step > 0
    costs = [first.verify_width(w) for w in range(1, 40)]
    assert all(b >= a for a, b in zip(costs, costs[1:]))
    # another drafter of the same pair has its own entry
    make_decoder(tiny_pair, drafter="lookup")
    assert len(list(calib_dir.glob("*.json"))) == 2


@pytest.mark.parametrize("damage", ["not json", '{"format": 1, "draft_step": "x"}', '{"format": 99}',
                                    '{"format": 1, "draft_step": 0.3, "verify": [2.0, 1.0], "plain_step_s": 0.1}'])
def test_a_damaged_calibration_is_ignored_with_a_warning_and_measured_again(tiny_pair, calib_dir, capsys, damage):
    make_decoder(tiny_pair)
    path, = calib_dir.glob("*.json")
    path.write_text(damage)
    capsys.readouterr()
    cost = make_decoder(tiny_pair).policy.cost
    err = capsys.readouterr().err
    assert cost.source == "measured"
    assert f"note: ignoring the calibration file {path}" in err and "Traceback" not in err
    assert json.loads(path.read_text())["format"] == cost_model.FORMAT  # replaced by a good one


def test_same_seed_same_tokens_with_the_calibration_from_the_cache(tiny_pair, calib_dir):
    make_decoder(tiny_pair)  # measured and cached
    path, = calib_dir.glob("*.json")
    # priced as a pair that pays: the tiny models' own timings are noise, and under load a draft
    # step measured near a plain step made every round plain (no draft to test the seed with)
    doc = json.loads(path.read_text())
    doc.update(draft_step=0.2, verify=[1 + 0.05 * i for i in range(len(doc["verify"]))], draft_widths=[])
    path.write_text(json.dumps(doc))
    runs = [mlxspec.generate(tiny_pair, "seed test", max_tokens=40, temp=1.0, seed=s) for s in (7, 7, 8)]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].stats.k_history == runs[1].stats.k_history
    assert runs[0].tokens != runs[2].tokens
    assert runs[0].stats.draft_proposed > 0
    assert make_decoder(tiny_pair).policy.cost.draft_step == 0.2  # the runs' prices came from the cache


def test_num_draft_max_zero_is_plain_decoding(tiny_pair):
    res = mlxspec.generate(tiny_pair, "one two", max_tokens=10, num_draft_max=0)
    plain = mlxspec.generate(tiny_pair, "one two", max_tokens=10, drafter="none")
    assert res.tokens == plain.tokens and res.stats.draft_proposed == 0
    assert set(res.stats.k_history) == {0}


def test_calibrate_command_measures_and_prints(tiny_pair_dirs, calib_dir):
    target, draft = tiny_pair_dirs
    out = subprocess.run([sys.executable, "-m", "mlxspec.cli", "calibrate", "--model", str(target), "--draft", str(draft)],
                         capture_output=True, text=True, env={**os.environ}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "draft step:" in out.stdout and "verify pass by width" in out.stdout
    assert "draft forward by width" in out.stdout
    assert len(list(calib_dir.glob("*.json"))) == 1
    js = subprocess.run([sys.executable, "-m", "mlxspec.cli", "calibrate", "--model", str(target), "--draft", str(draft),
                         "--json"], capture_output=True, text=True, env={**os.environ}, timeout=300)
    doc = json.loads(js.stdout)
    assert doc["source"] == "measured" and doc["verify"][0] == 1.0


def test_a_lucky_pass_does_not_set_the_price():
    """One fast repeat among slow ones (a quiet moment on a shared machine) must not
    make a wide pass look cheap: format 1 took the minimum of two repeats and priced a
    9-position pass at 1.51 plain steps where the loop's passes took ~1.7."""
    times = {1: [0.40, 0.41, 0.40], 8: [0.48, 0.68, 0.70], "draft": [0.12, 0.12, 0.13]}
    cm = cost_model.from_times(times)
    assert cm.verify_width(8) == pytest.approx(0.68 / 0.40, abs=0.01)
    assert cm.draft_step == pytest.approx(0.30, abs=0.01)


def test_the_plain_step_the_draft_step_and_narrow_passes_are_timed_several_times_per_repeat(tiny_pair, monkeypatch):
    """Every cost is relative to the plain step, and the draft's to both: with one timing
    of each per repeat (three in all) `mlxspec calibrate` priced the default draft's step
    at 0.23, 0.35 and 0.27 plain steps in three runs on one quiet machine, and the rule
    drafts very differently at each.  Each is now the median of REPEATS x SAMPLES.  So is
    a pass over up to SAMPLED_WIDTH positions: one timing each gave a 2-position pass
    1.05-1.13 plain steps, and a tree's first sibling widens a pass from 2 to 3."""
    seen = {}

    def spy(times, relative_cost=0.0):
        seen.update({k: len(v) for k, v in times.items()})
        return from_times(times, relative_cost)

    from_times = cost_model.from_times
    monkeypatch.setattr(cost_model, "from_times", spy)
    dec = make_decoder(tiny_pair)
    cost_model.calibrate(tiny_pair.target, dec.drafter, 64, widths=(1, 2, 4, 12))
    assert seen[1] >= 3 * cost_model.REPEATS and seen["draft"] >= 3 * cost_model.REPEATS
    assert seen[1] == seen["draft"] == seen[2] == seen[4] == cost_model.REPEATS * cost_model.SAMPLES
    assert seen[12] == cost_model.REPEATS * cost_model.WIDE_SAMPLES


def test_the_widths_are_timed_round_robin(tiny_pair, monkeypatch):
    """Each sweep times every width once: three timings of one width in a row put a
    spell of load on that width alone (a 2-position draft forward priced at 1.00-1.14
    of one in runs minutes apart)."""
    order = []
    forward = ModelState.forward

    def spy(self, tokens):
        order.append((self.model is tiny_pair.target, len(tokens)))
        return forward(self, tokens)

    drafter = make_decoder(tiny_pair).drafter
    monkeypatch.setattr(ModelState, "forward", spy)
    cost_model.calibrate(tiny_pair.target, drafter, 64, widths=(1, 2, 4, 16))
    target = [w for is_target, w in order if is_target and w in (1, 2, 4, 16)]
    sweep = [1, 2, 4, 16] * cost_model.WIDE_SAMPLES + [1, 2, 4] * (cost_model.SAMPLES - cost_model.WIDE_SAMPLES)
    assert target == [1, 2, 4, 16] + sweep * cost_model.REPEATS  # a warm-up makes every call once
    draft = [w for is_target, w in order if not is_target and w in (2, 3, 16)]  # the draft's forwards by width
    assert draft[:3] == [2, 3, 16] and draft.count(16) == cost_model.SAMPLES * cost_model.REPEATS + 1


def test_the_drafts_forwards_are_priced_by_their_own_width_curve(tiny_pair, calib_dir):
    """A draft forward over w positions is measured, not taken to cost what a target pass
    does: an int8 draft is compute-bound at fewer positions (5 positions: 1.65x one,
    where a target pass is 1.26x), and token trees priced by the target's curve grew
    wide draft levels that did not pay."""
    first = make_decoder(tiny_pair).policy.cost
    d = first.draft_widths
    assert len(d) == max(cost_model.DRAFT_WIDTHS) and d[0] == 1.0 and min(d) >= 1.0
    assert first.draft_width(1) == first.draft_step
    assert first.draft_width(4) == pytest.approx(first.draft_step * d[3])
    assert make_decoder(tiny_pair).policy.cost.draft_widths == d  # kept in the cache
    times = {1: [0.4] * 3, 8: [0.6] * 3, "draft": [0.1] * 3, "draft@1": [0.1] * 3, "draft@4": [0.2] * 3}
    cm = cost_model.from_times(times)
    assert cm.draft_curve(4) == pytest.approx(2.0) and cm.draft_curve(2) == pytest.approx(4 / 3, abs=0.01)
    assert cm.draft_curve(8) != cm.verify_width(8)
    assert cost_model.from_times({1: [0.4], 8: [0.6], "draft": [0.1]}).draft_curve(8) == pytest.approx(1.5)


def test_a_calibration_from_the_older_format_is_measured_again(tiny_pair, calib_dir, capsys):
    """Format-1 files (minima of two repeats, five widths) under-priced wide passes: an
    upgrade measures again rather than trust them."""
    first = make_decoder(tiny_pair).policy.cost
    path = next(calib_dir.glob("*.json"))
    old = json.loads(path.read_text())
    old["format"], old["verify"] = 1, [1.0] * len(old["verify"])
    path.write_text(json.dumps(old))
    capsys.readouterr()
    again = make_decoder(tiny_pair).policy.cost
    assert again.source == "measured" and "measuring again" in capsys.readouterr().err
    assert first.verify[0] == again.verify[0] == 1.0


def test_every_width_a_tree_commonly_verifies_is_timed_not_interpolated():
    """The small kernel runs a pass in register tiles of at most 6 rows on AVX2, so a pass's
    cost climbs in steps (an AVX2 EPYC: 6 / 7 positions 1.86 / 2.44 plain steps, 12 / 13
    2.73 / 3.52).  Timed at 1, 2, 3, 4, 6, 8, 12 and 16 and interpolated, 7 and 13 were priced
    2.14 and 2.96, and token trees grew to 13 positions where 12 cost 0.8 plain steps less."""

    def steps(w):  # a pass over w positions, in plain steps: 0.9 more for each tile of 6 rows
        return 1.0 + 0.9 * ((w - 1) // 6) + 0.02 * (w - 1)

    times = {w: [0.1 * steps(w)] * 3 for w in cost_model.WIDTHS}
    times["draft"] = [0.03] * 3
    cm = cost_model.from_times(times)
    for w in range(1, cost_model.TIMED_UP_TO + 1):
        assert cm.verify_width(w) == pytest.approx(steps(w), abs=0.01), w
    assert cost_model.TIMED_UP_TO >= 17  # a 16-node tree and its pending token
