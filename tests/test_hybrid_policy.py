"""The draft-length policy on a recurrent target, where a partly rejected round
makes the next pass re-feed the kept positions, and those that rode along in it
(core/recurrent.py): against synthetic drafters with known costs (policy_util.py), `auto`
is never slower than plain decoding and about as fast as the best fixed k; the
control -- the same policy blind to the re-feed cost -- is slower than plain where
drafting only looks marginal; the pile-up chain's re-fed positions per pass match a
real ModelState's, and its predicted speed-up the simulation; where the pile-up
makes drafting lose, `auto` falls back and says so, in the real loop too."""

import random

import mlx.core as mx
import numpy as np
import pytest

import tiny_hybrid
from mlxspec.api import make_policy
from mlxspec.core.cache import ModelState
from mlxspec.costs.cost_model import CostModel, expected_refed, expected_riding, merge_limit, predicted_speedup
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import Drafter, ModelDrafter, Proposal
from mlxspec.core.recurrent import state_arrays
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from policy_util import Recurrent, Text, costs, uniform

# a pass over 2 positions costs little more than a plain step, wider ones much more: a
# re-fed run that rides along pushes the next pass past the cheap width (rides up to 3)
STEEP = CostModel(0.05, [1.0, 1.05] + [1.3 + 0.2 * i for i in range(15)])


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
@pytest.mark.parametrize("cm", [costs(0.1, 0.2), STEEP], ids=["linear", "steep"])
def test_predicted_speedup_matches_the_simulation(a, k, cm):
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


@pytest.mark.parametrize("arch,slope,a,k", [("qwen3_5", 0.1, 0.5, 4), ("qwen3_5", 0.2, 0.7, 3), ("mamba2", 0.1, 0.3, 2)])
def test_the_pile_up_chain_matches_a_real_model_state(arch, slope, a, k):
    """Rounds of k drafts, each kept with probability a, through a real ModelState:
    its re-fed positions per pass are the chain's long-run figure, well above what
    one rejection alone would re-feed."""
    cm = costs(0.0, slope)
    state = ModelState(tiny_hybrid.build(arch))
    state.merge_limit = merge_limit(cm)
    rng = random.Random(0)
    history = [5, 6, 7, 8]
    state.prefill(history)
    refed = []
    for _ in range(500):
        before = state.refed
        pending = state.sync(history)
        refed.append(state.refed - before)
        drafts = [rng.randrange(10, 290) for _ in range(k)]
        mx.eval(state.forward(pending + drafts), state_arrays(state.cache))
        kept = 0
        while kept < k and rng.random() < a:
            kept += 1
        own = drafts[kept] + 1 if kept < k else rng.randrange(10, 290)  # the target's own token
        history = history + drafts[:kept] + [own]
    measured, chain = np.mean(refed[1:]), expected_refed(cm, a, k)
    one_rejection = sum(a ** j * (1 - a) * (j + 1) for j in range(k))
    print(f"{arch}: re-fed per pass {measured:.2f}, chain {chain:.2f}, one rejection {one_rejection:.2f}")
    assert abs(measured - chain) < 0.1 * chain
    assert measured > 1.25 * one_rejection


@pytest.mark.parametrize("a", [0.2, 0.25])
@pytest.mark.parametrize("seed", range(3))
def test_auto_falls_back_where_the_pile_up_makes_drafting_lose(a, seed):
    """A first draft costs little to verify (STEEP), but a rejected one's re-fed
    position rides along and widens the passes after it: at this acceptance
    drafting loses (the chain predicts < 0.85x); `auto` falls back, says why, and
    stays at plain speed.  The policy priced with one rejection alone drafts on."""
    assert predicted_speedup(STEEP, a, 1, refeed=True) < 0.85
    stats = GenerationStats()
    pol = PerToken(STEEP, 8, refeed=True)
    pol.start(stats)
    tokens, cost, lengths = Text(lambda rng: a, lambda c: a, seed=seed).run(
        pol, 600, stats, cm=STEEP, target=Recurrent(STEEP))
    assert sum(n == 0 for n in lengths[200:]) >= 0.9 * len(lengths[200:])
    assert tokens / cost >= 0.97
    assert [n for n in stats.notes if n.startswith("fallback") and "re-feed" in n], stats.notes


@pytest.mark.parametrize("seed", range(3))
def test_auto_drafts_where_it_pays_on_the_same_costs(seed):
    a = 0.9
    pol = PerToken(STEEP, 8, refeed=True)
    pol.start(GenerationStats())
    tokens, cost, lengths = Text(lambda rng: a, lambda c: a, seed=seed).run(
        pol, 600, cm=STEEP, target=Recurrent(STEEP))
    best = max(predicted_speedup(STEEP, a, k, refeed=True) for k in range(1, 9))
    assert all(n > 0 for n in lengths) and not pol.fallback
    assert tokens / cost >= 0.95 * best, (tokens / cost, best)


class ScriptedDrafter(Drafter):
    """Proposes the target's greedy continuation (known in advance), each token
    replaced by a wrong one with probability 1 - a; its confidence says a."""

    name = "scripted"
    max_k = 8

    def __init__(self, reference, a, seed=0):
        self.reference, self.a, self.rng = reference, a, random.Random(seed)

    def propose(self, history, k, params, key, rnd=None):
        out = []
        for tok in self.reference[len(history): len(history) + k]:
            if not (rnd.more() and rnd.offer(self.a)):
                break
            out.append(tok if self.rng.random() < self.a else (tok + 1) % 300)
        return Proposal(out, None, [self.a] * len(out))


@pytest.mark.parametrize("a,seed", [(0.3, 0), (0.3, 1), (0.9, 0)])
def test_auto_on_a_hybrid_in_the_real_loop(a, seed):
    """The decoder reports the re-fed positions riding along in each pass: at 30 %
    acceptance on STEEP costs (the chain predicts 0.88x for single drafts) `auto`
    falls back and says so -- priced with one rejection alone it drafts every round --
    and at 90 % it drafts; the output is plain decoding's either way."""
    target, prompt = tiny_hybrid.build("qwen3_5", layer_scale=0.5), [5, 6, 7, 8]
    reference = list(prompt)
    list(SpeculativeDecoder(target).generate(reference, max_tokens=420))
    stats = GenerationStats()
    history = list(prompt)
    dec = SpeculativeDecoder(target, ScriptedDrafter(reference, a, seed), PerToken(STEEP, 8, refeed=True))
    list(dec.generate(history, max_tokens=400, stats=stats))
    assert history == reference[: len(history)] and len(history) == len(prompt) + 400
    fallback = [n for n in stats.notes if n.startswith("fallback")]
    if a < 0.5:
        assert fallback and "re-feed" in fallback[0], stats.notes
        assert stats.tokens_plain > 0.6 * 400, stats.k_history
    else:
        assert not fallback and stats.refed_positions > 0
        assert stats.tokens_plain <= 1  # the last round, where max_tokens leaves no room to draft


class Recorder(FixedK):
    """k drafts a round, on `cost`, recording what the decoder reports for each pass."""

    refeed = True

    def __init__(self, k, cost):
        super().__init__(k)
        self.cost, self.reports = cost, []

    def observe_refeed(self, riding):
        self.reports.append(riding)


def test_the_decoder_reports_what_rides_along_as_the_chain_predicts():
    """What `auto` learns from (the re-fed positions riding along in each pass, as the
    decoder reports them) and the stats' re-fed positions per pass, in the real loop
    with rounds of 4 drafts kept with probability 0.5: the chain's figures."""
    cm, a, k = costs(0.0, 0.1), 0.5, 4
    target, prompt = tiny_hybrid.build("qwen3_5", layer_scale=0.5), [5, 6, 7, 8]
    reference = list(prompt)
    list(SpeculativeDecoder(target).generate(reference, max_tokens=620))
    policy, stats = Recorder(k, cm), GenerationStats()
    dec = SpeculativeDecoder(target, ScriptedDrafter(reference, a, seed=3), policy)
    list(dec.generate(list(prompt), max_tokens=600, stats=stats))
    assert dec.target.merge_limit == merge_limit(cm) == 5
    riding, chain = np.mean(policy.reports), expected_riding(cm, a, k)
    print(f"riding {riding:.2f} (chain {chain:.2f}), re-fed per pass {stats.refed_positions / stats.target_passes:.2f} "
          f"(chain {expected_refed(cm, a, k):.2f})")
    assert abs(riding - chain) < 0.15 * chain
    assert abs(stats.refed_positions / stats.target_passes - expected_refed(cm, a, k)) < 0.15 * expected_refed(cm, a, k)


def test_the_loop_syncs_the_target_once_a_round_and_reports_what_that_sync_feeds():
    """What rides along is foreseen (`ModelState.pending_count`), not synced for: one
    target sync per round, and each report is what that round's sync then re-feeds."""
    cm, k = costs(0.0, 0.1), 4
    target, prompt = tiny_hybrid.build("qwen3_5", layer_scale=0.5), [5, 6, 7, 8]
    reference = list(prompt)
    list(SpeculativeDecoder(target).generate(reference, max_tokens=80))
    policy, stats = Recorder(k, cm), GenerationStats()
    dec = SpeculativeDecoder(target, ScriptedDrafter(reference, 0.5, seed=3), policy)
    fed, sync = [], dec.target.sync

    def counted(history):
        pending = sync(history)
        fed.append(len(pending))
        return pending

    dec.target.sync = counted
    list(dec.generate(list(prompt), max_tokens=60, stats=stats))
    rounds = fed[1:-1]  # the prefill's sync first, the one after the last round last
    assert len(rounds) == stats.target_passes and len(policy.reports) >= stats.target_passes - 1
    limit = dec.target.merge_limit
    assert policy.reports == [n - 1 if n - 1 <= limit else 0 for n in rounds[: len(policy.reports)]]
    assert any(policy.reports), policy.reports  # some rounds had re-fed positions riding along
