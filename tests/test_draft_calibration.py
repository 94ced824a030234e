"""benchmarks/draft_calibration.py: it records every draft outcome the policy is told of,
and tallies them by the draft's confidence."""

import pytest

import test_greedy_equality as ge
from bench_util import load_benchmark
from mlxspec.api import make_policy
from mlxspec.core.stats import GenerationStats
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.drafting.drafters import ModelDrafter


def test_the_bands_count_every_outcome_once():
    cal = load_benchmark("draft_calibration")
    seen = [(0.3, True), (0.4, False), (0.5, True), (0.99, False), (1.0, True), (0.995, True)]
    got = cal.bands(seen)
    assert [(lo, hi, n) for lo, hi, n, _, _ in got] == [(0.0, 0.5, 2), (0.5, 0.7, 1), (0.99, 1.0, 3)]
    assert got[0][3:] == pytest.approx((0.35, 0.5)) and got[2][3:] == pytest.approx((0.995, 2 / 3))


def test_the_recorded_outcomes_are_the_rounds_drafts_up_to_the_first_rejection():
    cal = load_benchmark("draft_calibration")
    target, drafts = ge.models("llama")
    d = ModelDrafter(drafts[0])
    policy = make_policy("auto", d, cost_profile="apple-m3plus-32b")  # a cheap draft: every round drafts
    seen = cal.record(policy)
    stats = GenerationStats()
    out = [t for t, _ in SpeculativeDecoder(target, d, policy, tree=False).generate(
        [7, 19, 200, 31, 31, 5], max_tokens=ge.MAX_TOKENS, stats=stats)]
    assert out == ge.plain(target, [7, 19, 200, 31, 31, 5])  # recording changes nothing
    assert seen and all(0.0 <= c <= 1.0 for c, _ in seen)
    assert sum(k for _, k in seen) == stats.draft_accepted
    assert 0 < sum(not k for _, k in seen) <= stats.target_passes  # at most one rejection a round
    assert sum(n for _, _, n, _, _ in cal.bands(seen)) == len(seen)
