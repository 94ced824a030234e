"""benchmarks/ceiling.py: its oracle is exact on cases worked by hand, and no real
draft-length policy played on the same outcomes beats it."""

import random

import pytest

from bench_util import load_benchmark
from mlxspec.costs import draft_length
from mlxspec.costs.cost_model import CostModel

# this machine's calibration of the default pair (format 2), rounded
CM = CostModel(draft_step=0.31, verify=[1.0, 1.16, 1.32, 1.49, 1.5, 1.52, 1.52, 1.52, 1.66, 1.81, 1.97, 2.12])


@pytest.fixture(scope="module")
def ceiling():
    return load_benchmark("ceiling")


def test_the_oracle_on_cases_worked_by_hand(ceiling):
    assert ceiling.oracle([False] * 10, CM) == 1.0  # nothing to draft: plain steps
    # 13 tokens, all guessed: one round of 12 drafts (3.72 + V(13) = 2.12 + 0.15 slope) beats any split
    v13 = CM.verify_width(13)
    assert ceiling.oracle([True] * 13, CM) == pytest.approx(13 / (12 * 0.31 + v13))
    # a miss every third token: rounds of 2 drafts, 3 tokens for 0.62 + 1.32
    assert ceiling.oracle([True, True, False] * 4, CM) == pytest.approx(12 / (4 * (0.62 + 1.32)))
    # one guessed token: a draft step and a pass over 2 (0.31 + 1.16) beat 2 plain steps;
    # with a dearer draft (0.9 + 1.16 > 2) they do not
    assert ceiling.oracle([True, False], CM) == pytest.approx(2 / 1.47)
    dear = CostModel(draft_step=0.9, verify=CM.verify)
    assert ceiling.oracle([True, False], dear) == 1.0


def test_no_policy_beats_the_oracle(ceiling):
    rng = random.Random(0)
    for trial in range(40):
        n, stay = rng.randint(20, 80), rng.uniform(0.5, 0.95)
        match, ok = [], True
        for _ in range(n):  # clustered outcomes, as in real text
            ok = ok if rng.random() < stay else not ok
            match.append(ok if rng.random() < 0.9 else not ok)
        conf = [rng.uniform(0.7, 1.0) if m else rng.uniform(0.1, 0.9) for m in match]
        bound = ceiling.oracle(match, CM)
        for policy in (draft_length.PerToken(CM, 12), draft_length.FixedK(1), draft_length.FixedK(4),
                       draft_length.FixedK(12), draft_length.FixedK(0)):
            assert ceiling.play(policy, match, conf, CM) <= bound + 1e-9, (trial, policy)


def test_play_counts_what_a_round_costs(ceiling):
    """FixedK(3) over 8 guessed tokens: rounds of 3 drafts emit 4 tokens each; the second
    round's first draft step also feeds the first round's last draft (never fed)."""
    cost = (3 * 0.31 + CM.verify_width(4)) * 2 + 0.31 * (CM.verify_width(2) - 1)
    assert ceiling.play(draft_length.FixedK(3), [True] * 8, [1.0] * 8, CM) == pytest.approx(8 / cost)
