"""The draft-length policy on a recurrent target, where a partly rejected round
makes the next pass re-feed the kept positions (recurrent.py): against synthetic
drafters with known costs (as test_draft_length.py), `auto` is never slower than
plain decoding and about as fast as the best fixed k; the control -- the same
policy blind to the re-feed cost -- is slower than plain where drafting only
looks marginal; the cost model's predicted speed-up matches the simulation;
and the loop reports re-fed positions."""

import numpy as np
import pytest

import tiny_hybrid
from mlxspec.api import make_policy
from mlxspec.cost_model import predicted_speedup
from mlxspec.draft_length import FixedK, PerToken
from mlxspec.drafters import ModelDrafter
from policy_util import Recurrent, Text, costs, uniform


def hybrid_speed(text, policy, cm, rounds=3000):
    """tokens / cost on a recurrent target (policy_util.Recurrent: re-fed positions pile up)."""
    tokens, cost, _ = text.run(policy, rounds, cm=cm, target=Recurrent(cm))
    return tokens / cost


CASES = {
    # (confidence, acceptance given confidence, draft step, verify slope per position)
    "gpu-like, good draft": (uniform(0.3, 1.0), lambda c: c, 0.1, 0.03),
    "cpu-like, good draft": (uniform(0.3, 1.0), lambda c: c, 0.1, 0.3),
    "cpu-like, marginal draft": (lambda rng: 0.9, lambda c: 0.45, 0.05, 0.3),
    "cpu-like, poor draft": (lambda rng: 0.6, lambda c: 0.3, 0.2, 0.4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_is_never_slower_than_plain_on_a_recurrent_target(case):
    confidence, accept, step, slope = CASES[case]
    cm = costs(step, slope)
    make = lambda: Text(confidence, accept, seed=1)  # noqa: E731
    fixed = {k: hybrid_speed(make(), FixedK(k), cm) for k in range(0, 13)}
    best = max(fixed, key=fixed.get)
    auto = hybrid_speed(make(), PerToken(cm, 12, refeed=True), cm)
    print(case, f"auto {auto:.3f}, best fixed k={best} {fixed[best]:.3f}, plain {fixed[0]:.3f}")
    assert fixed[0] == 1.0
    assert auto >= 0.97 and auto >= 0.95 * fixed[best], (auto, best, fixed)


def test_the_control_blind_to_the_refeed_cost_is_slower_than_plain():
    confidence, accept, step, slope = CASES["cpu-like, marginal draft"]
    cm = costs(step, slope)
    blind = hybrid_speed(Text(confidence, accept, seed=1), PerToken(cm, 12, refeed=False), cm)
    aware = hybrid_speed(Text(confidence, accept, seed=1), PerToken(cm, 12, refeed=True), cm)
    print(f"blind {blind:.3f}, aware {aware:.3f}")
    assert blind < 0.97 <= aware


@pytest.mark.parametrize("a", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_predicted_speedup_matches_the_simulation(a, k):
    cm = costs(0.1, 0.2)
    sim = hybrid_speed(Text(lambda rng: 0.5, lambda c: a, seed=2), FixedK(k), cm, rounds=20000)
    pred = predicted_speedup(cm, a, k, refeed=True)
    assert abs(sim - pred) / pred < 0.03, (sim, pred)
    assert pred < predicted_speedup(cm, a, k)  # the re-feed is a cost


def test_make_policy_knows_a_recurrent_target():
    class Pair:
        target = tiny_hybrid.build("mamba2")

    cm = costs(0.1, 0.1)
    assert make_policy("auto", ModelDrafter(tiny_hybrid.build("qwen2")), Pair, cost=cm).refeed
    Pair.target = tiny_hybrid.build("qwen2")
    assert not make_policy("auto", ModelDrafter(Pair.target), Pair, cost=cm).refeed
    assert np.isclose(predicted_speedup(cm, 0.0, 0), 1.0)
