"""The per-token draft-length policy against synthetic drafters (known costs, known
acceptance by confidence: policy_util.py), and its fallback in the real loop."""

import re

import numpy as np
import pytest

import tiny_models
from mlxspec.costs.cost_model import CostModel, assumed
from mlxspec.costs.draft_length import PROBE_MAX, FixedK, Mean, PerToken, Round
from mlxspec.trees.budget import TreeBudget
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from policy_util import Text, costs, uniform


def fixed(k, cm):
    p = FixedK(k)
    p.true_cost = cm
    return p


def speed(text_factory, policy, rounds=3000):
    tokens, cost, lengths = text_factory().run(policy, rounds)
    return tokens / cost, lengths


CASES = {
    # confidence tells the truth; cheap draft: long rounds where the draft is sure
    "calibrated-cheap": (uniform(0.3, 1.0), lambda c: c, 0.1),
    # the default pair's shape: a confident draft, a draft step ~0.3 of the target's
    "confident-pair": (lambda rng: 1 - rng.beta(0.5, 4), lambda c: min(1.0, 0.05 + c), 0.3),
    # confidence says nothing (always 0.9) while 75 % are kept: the rule must learn it
    "uninformative": (lambda rng: 0.9, lambda c: 0.75, 0.2),
    # an overconfident draft: says 0.95, right half the time
    "overconfident": (lambda rng: 0.95, lambda c: 0.5, 0.15),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_token_is_at_least_as_fast_as_the_best_fixed_k(case):
    confidence, accept, step = CASES[case]
    cm = costs(step)
    make = lambda: Text(confidence, accept, seed=1)  # noqa: E731
    fixed_speeds = {k: speed(make, fixed(k, cm))[0] for k in range(0, 13)}
    best_k = max(fixed_speeds, key=fixed_speeds.get)
    auto, lengths = speed(make, PerToken(cm, 12))
    print(case, f"auto {auto:.3f}, best fixed k={best_k} {fixed_speeds[best_k]:.3f}, mean length {np.mean(lengths):.2f}")
    assert auto >= 0.97 * fixed_speeds[best_k], (auto, best_k, fixed_speeds)


def test_confidence_decides_where_rounds_stop():
    """With a truthful confidence, per-token stopping beats every fixed k (it stops
    early where the draft is unsure: +4 % here, as SpecDec++ reports 7-11 % on real
    text, where confidence also runs in streaks), and rounds vary in length."""
    cm = costs(0.1)
    make = lambda: Text(uniform(0.3, 1.0), lambda c: c, seed=2)  # noqa: E731
    best_fixed = max(speed(make, fixed(k, cm))[0] for k in range(0, 13))
    auto, lengths = speed(make, PerToken(cm, 12))
    assert auto >= 1.02 * best_fixed
    assert len(set(lengths)) >= 4


def test_the_threshold_follows_the_costs():
    """No constant: a dearer draft step or a dearer verify pass gives shorter rounds."""
    make = lambda: Text(lambda rng: 1 - rng.beta(0.5, 4), lambda c: c, seed=3)  # noqa: E731
    means = [np.mean(speed(make, PerToken(costs(step, slope), 12), 1500)[1])
             for step, slope in [(0.05, 0.02), (0.3, 0.02), (0.3, 0.2)]]
    assert means[0] > means[1] > means[2], means


def test_falls_back_when_drafting_cannot_pay_and_says_so():
    """A draft costing 0.6 of a target step with 30 % acceptance loses to plain decoding."""
    stats = GenerationStats()
    pol = PerToken(costs(0.6), 12)
    pol.start(stats)
    make = lambda: Text(uniform(0.0, 1.0), lambda c: 0.3, seed=4)  # noqa: E731
    tokens, cost, lengths = make().run(pol, 600, stats)
    assert pol.fallback
    assert sum(n > 0 for n in lengths[50:]) < 0.1 * len(lengths[50:])
    assert tokens / cost >= 0.95  # plain decoding's speed is 1 token per plain step
    assert [n for n in stats.notes if n.startswith("fallback")], stats.notes
    assert len(stats.notes) <= 2  # a fallback note (and a resumed one), not one per round


def test_the_fallback_note_does_not_contradict_itself_after_rounds_that_lost():
    """The rule judges a first draft token against plain decoding's one token a plain step
    (`worth_drafting`); the note once scaled the bar by the recent rate, so after rounds
    that lost (half a token a plain step) it read "(at most 0.51) is below the 0.30"."""
    stats = GenerationStats()
    pol = PerToken(assumed(0.3, slope=0.3))  # a first draft token must reach 0.3 + 0.3 plain steps
    pol.start(stats)
    pol.ledger.first = False
    pol.rates = [0.5, 1.0]  # recent rounds: half a token a plain step
    pol.mean[False] = m = Mean(0.5)
    m.evidence = 10_000.0  # the optimistic bound at the mean: 0.5, under the 0.6 a token must reach
    assert pol.choose() == 0 and pol.fallback
    note = [n for n in stats.notes if n.startswith("fallback")][0]
    got = re.search(r"acceptance \(at most ([\d.]+)\) is below the ([\d.]+) a draft token must reach", note)
    assert got, note
    assert float(got.group(1)) < float(got.group(2)) == pytest.approx(0.6), note


@pytest.mark.parametrize("acceptance", [0.7, 0.8, 0.9])
@pytest.mark.parametrize("seed", range(3))
def test_never_falls_back_at_70_percent_acceptance_on_a_pair_that_pays(acceptance, seed):
    """The default pair's costs (draft step 0.29, verify +6 % per position): drafting
    pays at these acceptance rates, so no round is a plain step -- but for a few after
    two unlucky first rounds (both rejected at once: the evidence then says a draft does
    not pay, and the next try waits for the exploration ledger, costs/exploration.py)."""
    pol = PerToken(costs(0.29), 12)
    pol.start(GenerationStats())
    _, _, lengths = Text(uniform(0.5, 1.0), lambda c: acceptance, seed=seed).run(pol, 400)
    assert sum(n == 0 for n in lengths) <= 8 and all(n > 0 for n in lengths[10:]), lengths
    assert not pol.fallback


def test_a_few_early_rejections_do_not_cause_fallback_and_a_bad_start_recovers():
    pol = PerToken(costs(0.29), 12)
    pol.start(GenerationStats())
    _, _, lengths = Text(lambda rng: 0.5, lambda c: 0.0, seed=5).run(pol, 2)
    assert all(n > 0 for n in lengths) and not pol.fallback
    Text(lambda rng: 0.5, lambda c: 0.0, seed=5).run(pol, 20)  # a long bad stretch: falls back
    assert pol.fallback
    _, _, lengths = Text(uniform(0.5, 1.0), lambda c: 0.7, seed=5).run(pol, 400)
    assert not pol.fallback
    # back after one of the first probes (each may fail); on these costs the draft's catch-up grows
    # faster than the ledger's share, so they come every PROBE_MAX plain tokens (costs/exploration.py)
    assert sum(n == 0 for n in lengths) <= 3 * (PROBE_MAX + 1)
    assert all(n > 0 for n in lengths[-80:])


def test_probes_with_backoff_and_resumes():
    pol = PerToken(costs(0.5), 12)
    stats = GenerationStats()
    pol.start(stats)
    _, _, lengths = Text(uniform(0.0, 0.3), lambda c: 0.02, seed=6).run(pol, 700)
    probes = [i for i in range(1, len(lengths)) if lengths[i] > 0 and lengths[i - 1] == 0]
    gaps = np.diff(probes)
    # a probe's cost (its draft step, the draft's catch-up over the plain tokens, a verify position)
    # grows faster than the 2 % of each plain step the ledger sets aside: one every PROBE_MAX tokens
    assert len(probes) >= 4 and all(g >= PROBE_MAX for g in gaps), probes
    # the text changes (the model starts quoting its input): a probe notices
    _, _, lengths = Text(uniform(0.95, 1.0), lambda c: 0.97, seed=7).run(pol, 600)
    assert not pol.fallback
    assert sum(n > 0 for n in lengths[-100:]) >= 95
    assert any(n.startswith("resumed") for n in stats.notes)


def test_a_new_generation_probes_at_once():
    pol = PerToken(costs(0.5), 12)
    Text(uniform(0.0, 0.3), lambda c: 0.0, seed=8).run(pol, 40)
    assert pol.fallback and pol.choose() == 0
    pol.start(GenerationStats())
    assert pol.choose() > 0


def test_acceptance_is_learnt_by_confidence_bucket():
    pol = PerToken(costs(0.1), 12)
    for _ in range(300):
        pol.update(Round(pol, 4), [(0.97, True), (0.35, False)])
    assert pol.acceptance(0.97) > 0.95
    assert pol.acceptance(0.35) < 0.05
    assert pol.acceptance(0.75) == pytest.approx(0.75, abs=0.01)  # untouched: its prior, the bucket centre
    assert 0.45 < pol.mean_acceptance() < 0.55


def test_bounds_and_fixed_rounds():
    with pytest.raises(ValueError):
        PerToken(costs(0.1), 0)
    with pytest.raises(ValueError):
        FixedK(-1)
    rnd = FixedK(3).round(3)
    assert [rnd.more() and rnd.offer(0.01) for _ in range(5)] == [True, True, True, False, False]
    pol = PerToken(costs(0.0001), 3)
    _, _, lengths = Text(uniform(0.99, 1.0), lambda c: 1.0, seed=9).run(pol, 100)
    assert max(lengths) == 3 and lengths.count(3) > 90


def test_fallback_in_the_real_loop_counts_tokens_by_mode_and_stays_lossless():
    """An unrelated draft as slow as the target (no acceptance): the policy stops
    drafting; stats count plain vs speculative tokens; output is plain decoding's."""
    target = tiny_models.make_model("llama", seed=11)
    other = tiny_models.make_model("llama", seed=99)
    prompt = [9, 8, 7]
    plain = [t for t, _ in SpeculativeDecoder(target).generate(list(prompt), max_tokens=60)]
    dec = SpeculativeDecoder(target, ModelDrafter(other), PerToken(assumed(1.0), 8))
    stats = GenerationStats()
    got = [t for t, _ in dec.generate(list(prompt), max_tokens=60, stats=stats)]
    assert got == plain
    assert stats.tokens_plain + stats.tokens_speculative == 60
    assert stats.tokens_plain > 40, stats.k_history
    assert any(n.startswith("fallback") for n in stats.notes)
    assert "fell back to plain decoding" in stats.summary()


def stepped(draft_step):
    """A verify curve like this machine's calibration on 2026-12-01: positions 3-4 dear,
    5-8 free (1.0, 1.11, 1.30, 1.49, 1.49, 1.49, 1.49, 1.49, then +0.03 a position)."""
    from mlxspec.costs.cost_model import CostModel

    return CostModel(draft_step, [1.0, 1.11, 1.30, 1.49, 1.49, 1.49, 1.49, 1.49] + [1.49 + 0.03 * i for i in range(1, 10)])


def test_the_rule_looks_past_dear_positions_to_cheaper_ones():
    """A myopic rule stops where the next position is dear even when the ones after it
    are free (the default pair's binary-search prompt: auto 2.67 tokens per pass where a
    fixed k=4 made 4.0); looking ahead, per-token drafting is again as fast as the best
    fixed k on such a curve."""
    cm = stepped(0.3)
    make = lambda: Text(lambda rng: 0.95, lambda c: 0.9, seed=4)  # noqa: E731
    fixed_speeds = {k: speed(make, fixed(k, cm))[0] for k in range(0, 13)}
    best_k = max(fixed_speeds, key=fixed_speeds.get)
    auto, lengths = speed(make, PerToken(cm, 12))
    # myopic (before): 0.948 of the best fixed k (7), 4.05 drafts a round; looking ahead: 0.992, 5.97
    assert best_k >= 5 and auto >= 0.97 * fixed_speeds[best_k], (auto, best_k, fixed_speeds, np.mean(lengths))
    assert np.mean(lengths) >= 5


def test_with_a_horizon_of_one_the_rule_is_the_marginal_one():
    from mlxspec.costs.draft_length import pays_ahead

    rng = np.random.default_rng(0)
    for _ in range(2000):
        p, a, c, t, e = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 2), rng.uniform(1, 5), rng.uniform(1, 5)
        assert pays_ahead(p, a, rng.uniform(0, 1), c, lambda j: 0.0, t, e, 1) == (p * a * t >= c * e)


# this machine's calibrated costs for the default pair (draft step, verify by width), as cached
DEFAULT_PAIR_CPU = CostModel(0.3, [1.0, 1.11, 1.3, 1.49, 1.49, 1.49, 1.49, 1.49, 1.51, 1.54, 1.56, 1.59, 1.62])


def test_an_early_rejection_does_not_keep_rounds_at_one_token():
    """The first round's draft (confidence 0.88) is rejected; from then on the draft
    is sure (confidence 1.0) and right.  The mean acceptance behind `more` has one
    rejection and its prior to go on: at the mean (0.40) a second token does not pay,
    and every round stayed at one token until the rare one-token outcomes pulled the
    mean up (10 rounds on the code prompt where this was seen).  The optimistic bound
    on so little evidence drafts on; the tree budget expands the same way."""
    pol = PerToken(DEFAULT_PAIR_CPU, 12)
    first = pol.round(12)
    assert first.more() and first.offer(0.88)
    pol.update(first, [(0.88, False)])
    assert pol.mean_acceptance() < 0.45

    rnd = pol.round(12)
    assert rnd.more() and rnd.offer(1.0)
    assert rnd.more(), "a second token after a sure, first one"

    budget = TreeBudget(pol, 12)
    assert budget.expand([1.0], 0) == 1 and budget.include(pol.acceptance(1.0), 1)
    assert budget.expand([pol.acceptance(1.0)], 1) == 1, "the tree grows below a sure first node"


def test_the_optimistic_bound_closes_in_on_the_mean():
    """The bound's width counts every outcome, not the decayed weight, so a long
    steady generation drafts at the mean (it does not over-draft by a fixed margin)."""
    pol = PerToken(DEFAULT_PAIR_CPU, 12)
    for i in range(2000):
        rnd = pol.round(12)
        rnd.more(), rnd.offer(0.9)
        pol.update(rnd, [(0.9, i % 10 < 7)])
    a, bound = pol.mean_acceptance(), pol.mean_acceptance(optimistic=True)
    assert 0.6 < a < 0.8
    assert bound - a < 0.015, (a, bound)



def round_bar(policy):
    """`policy` judging each token by its round's own E/T alone (the rule before the long-run bar)."""
    policy.rate = lambda: None
    return policy


def test_a_round_that_goes_well_drafts_on_while_tokens_beat_the_long_run_rate():
    """Where the round's E/T climbs above the generation's rate R, the round's own
    bar stops at its peak though further tokens would still raise the long-run rate;
    the bar min(R, E/T) drafts them.  It is never raised above E/T."""
    def drafted(rate):
        rnd = Round(pol, 12, rate)
        n = 0
        while rnd.more() and rnd.offer(0.97):
            n += 1
        return n

    pol = PerToken(costs(0.3), 12)
    for c in (0.95, 0.98, 0.99, 1.0):  # sure drafts are kept 90 % of the time
        pol.calibration.kept[pol.calibration.bucket(c)], pol.calibration.seen[pol.calibration.bucket(c)] = 9.0, 10.0
    own = drafted(None)
    assert drafted(1.2) > own, "a low long-run rate: more tokens are worth drafting"
    assert drafted(50.0) == own, "a long-run rate above the round's own E/T changes nothing"


def test_the_long_run_rate_follows_the_rounds():
    pol = PerToken(costs(0.3), 12)
    start = pol.rate()
    rnd = pol.round(4)
    assert rnd.rate == start
    while rnd.more() and rnd.offer(0.99):
        pass
    for _ in range(40):
        pol.update(rnd, [(0.99, True)] * rnd.kept, rnd.kept + 1)
    assert abs(pol.rate() - (rnd.kept + 1) / rnd.t) < 0.02 * pol.rate(), (pol.rate(), rnd.kept, rnd.t)
    before = pol.rate()
    pol.update(pol.round(4), [], 0)  # a round not counted
    assert pol.rate() == before


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_long_run_bar_is_never_slower(case):
    """On rounds drawn independently (where maximising each round's E/T is already close
    to optimal) the bar min(R, E/T) costs nothing: 0.999-1.004x over 20,000 rounds."""
    confidence, accept, step = CASES[case]
    cm = costs(step)
    make = lambda: Text(confidence, accept, seed=1)  # noqa: E731
    new, _ = speed(make, PerToken(cm, 12))
    old, _ = speed(make, round_bar(PerToken(cm, 12)))
    assert new >= 0.99 * old, (new, old)


def test_a_tree_grows_on_while_its_nodes_beat_the_long_run_rate():
    """The tree budget takes the same bar: a path of sure nodes goes deeper under a low
    long-run rate, and no deeper under one above the tree's own E/T."""
    def depth(rate):
        pol = PerToken(costs(0.3), 12)
        pol.calibration.kept[pol.calibration.bucket(0.97)], pol.calibration.seen[pol.calibration.bucket(0.97)] = 9.0, 10.0
        pol.rate = lambda: rate
        budget, v, d = TreeBudget(pol, 12), 1.0, 0
        while budget.expand([v], d) and budget.include(v * pol.acceptance(0.97), d + 1):
            v, d = v * pol.acceptance(0.97), d + 1
        return d

    own = depth(None)
    assert depth(1.2) > own
    assert depth(50.0) == own
