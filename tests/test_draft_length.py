"""The adaptive draft-length policy against synthetic machines (known costs and
per-position acceptance), and its fallback in the real loop."""

import numpy as np
import pytest

import tiny_models
from mlxspec.draft_length import AdaptiveK, FixedK, make_adaptive
from mlxspec.drafters import ModelDrafter, PromptLookupDrafter
from mlxspec.speculative import SpeculativeDecoder
from mlxspec.stats import GenerationStats


class Machine:
    """A round costs draft_step * k + verify0 * (1 + slope * k); draft i is kept with
    probability accept[i] given the ones before it were kept."""

    def __init__(self, accept, draft_step, verify0=0.1, slope=0.1, seed=0, noise=0.0):
        self.accept, self.draft_step, self.verify0, self.slope = accept, draft_step, verify0, slope
        self.rng = np.random.default_rng(seed)
        self.noise = noise

    def a(self, i):
        return self.accept[min(i, len(self.accept) - 1)]

    def round(self, k):
        n = 0
        while n < k and self.rng.random() < self.a(n):
            n += 1
        jitter = lambda: 1 + self.noise * abs(self.rng.standard_normal())  # noqa: E731
        return n, self.draft_step * k * jitter(), self.verify0 * (1 + self.slope * k) * jitter()

    def speed(self, k):
        e, run = 1.0, 1.0
        for i in range(k):
            run *= self.a(i)
            e += run
        return e / (self.draft_step * k + self.verify0 * (1 + self.slope * k))

    def best(self, max_k=8):
        return max(range(max_k + 1), key=self.speed)


def drive(policy, machine, rounds, stats=None):
    ks = []
    for _ in range(rounds):
        k = policy.choose()
        n, dt, vt = machine.round(k)
        if stats is not None:
            stats.record_round(k, n, n + 1)
        policy.update(k, n, dt, vt)
        ks.append(k)
    return ks


CASES = [
    # (acceptance by position, draft step cost): the optimum moves with both
    ([0.9], 0.005),
    ([0.9], 0.03),
    ([0.75], 0.01),
    ([0.6], 0.01),
    ([0.95, 0.9, 0.6, 0.3], 0.005),
    ([0.8, 0.8, 0.2], 0.004),
]


@pytest.mark.parametrize("accept,draft_step", CASES)
def test_adaptive_picks_the_k_that_maximises_expected_speed(accept, draft_step):
    m = Machine(accept, draft_step, seed=1, noise=0.05)
    pol = AdaptiveK(max_k=8)
    ks = drive(pol, m, 400)
    best = m.best()
    assert best > 0
    chosen = max(set(ks[-100:]), key=ks[-100:].count)  # its steady choice (exploration aside)
    assert m.speed(chosen) >= 0.95 * m.speed(best), (chosen, best, [round(m.speed(k) * 0.1, 3) for k in range(9)])
    assert not pol.fallback
    # the model's own estimates are close to the truth
    assert abs(pol.acceptance()[0] - accept[0]) < 0.2
    assert pol.verify_cost(0) == pytest.approx(0.1, rel=0.1)
    assert pol.draft_cost(1) == pytest.approx(draft_step, rel=0.1)


def test_the_choice_differs_between_machines():
    """Not a constant: a cheap accurate draft gets long drafts, a poor one short ones."""
    picks = []
    for accept, step in ([0.95], 0.003), ([0.55], 0.02):
        pol = AdaptiveK(max_k=8)
        drive(pol, Machine(accept, step, seed=2), 300)
        picks.append(pol.best()[0])
    assert picks[0] >= 5 and picks[1] <= 2, picks


def test_falls_back_to_plain_decoding_when_drafting_cannot_pay():
    """A draft as slow as the target with 40 % acceptance never pays: after the first
    couple of rounds the policy drafts nothing, and says so in the stats."""
    stats = GenerationStats()
    pol = AdaptiveK(max_k=8)
    pol.start(stats)
    m = Machine([0.4], draft_step=0.09)
    ks = drive(pol, m, 200, stats)
    assert pol.fallback
    assert sum(k > 0 for k in ks[:10]) <= pol.min_draft_rounds  # gives up once the evidence is in
    drafting = sum(k > 0 for k in ks)
    assert drafting <= 20, ks  # only probes afterwards
    assert stats.tokens_plain > 150
    assert any(n.startswith("fallback") for n in stats.notes), stats.notes
    assert len(stats.notes) == 1  # one note, not one per round


def test_probes_again_with_backoff_and_resumes_when_drafting_pays_again():
    pol = AdaptiveK(max_k=8, probe_every=16, max_probe_every=64)
    stats = GenerationStats()
    pol.start(stats)
    bad = Machine([0.05], draft_step=0.05, seed=3)
    ks = drive(pol, bad, 400)
    probes = [i for i in range(1, len(ks)) if ks[i] > 0 and ks[i - 1] == 0]
    gaps = np.diff(probes)
    assert len(probes) >= 5
    assert gaps[0] >= 16 and gaps[1] > gaps[0]  # waits, then waits longer
    assert max(gaps) <= 64 + 2 * pol.probe_rounds  # capped
    # the text changes (say, the model starts quoting its input): a probe notices
    good = Machine([0.95], draft_step=0.005, seed=4)
    ks = drive(pol, good, 200)
    assert not pol.fallback
    assert sum(k > 0 for k in ks[-50:]) >= 45
    assert any(n.startswith("resumed") for n in stats.notes)


def first_probe_gaps(machine, rounds=1500):
    ks = drive(AdaptiveK(max_k=8), machine, rounds)
    probes = [i for i in range(1, len(ks)) if ks[i] > 0 and ks[i - 1] == 0]
    return list(np.diff(probes)), ks


def test_costly_probes_wait_longer_to_stay_within_budget():
    """Probing costs at most ~3 % of plain decoding: a draft that costs little probes
    about every 40 plain tokens, then less often (backoff); one costing 3 target passes
    per token waits until a probe's measured cost fits the budget."""
    cheap, _ = first_probe_gaps(Machine([0.05], draft_step=0.05, seed=5))
    costly, ks = first_probe_gaps(Machine([0.05], draft_step=0.3, seed=5))
    assert cheap[0] <= 50 and costly[0] >= 4 * cheap[0], (cheap, costly)
    # overall drafting time stays a small share: rounds that drafted cost 0.3 * k + 0.11
    draft_rounds = [k for k in ks[10:] if k > 0]
    extra = sum(0.3 * k + 0.01 * k for k in draft_rounds)
    assert extra / (0.1 * len(ks[10:])) < 0.06


def test_a_new_generation_probes_first_when_paused():
    pol = AdaptiveK(max_k=8)
    drive(pol, Machine([0.1], draft_step=0.08), 50)
    assert pol.fallback and pol.choose() == 0
    pol.start(GenerationStats())
    assert pol.choose() > 0


def test_timing_model_is_robust_and_interpolates():
    pol = AdaptiveK(max_k=8)
    assert pol.verify_cost(3) is None
    pol.update(1, 0, 9.9, 9.9)  # the first round is cold (allocations, first graphs): its times are ignored
    assert pol.verify_cost(3) is None and pol.draft_cost(1) == 0.0
    pol.update(2, 1, 0.02, 0.12)
    assert pol.verify_cost(0) == pytest.approx(0.12 / 1.2)  # prior slope of 10 % per position
    for vt in (0.1, 0.1, 0.1, 5.0):  # one outlier (the machine was busy)
        pol.update(0, 0, 0.0, vt)
    for vt in (0.14, 0.14, 0.14):
        pol.update(4, 4, 0.04, vt)
    assert pol.verify_cost(0) == pytest.approx(0.1)
    assert pol.verify_cost(4) == pytest.approx(0.14)
    assert 0.12 < pol.verify_cost(3) < 0.14 and pol.verify_cost(8) > 0.14  # a line through the medians
    assert pol.draft_cost(3) == pytest.approx(0.03)


def test_acceptance_by_position_is_conditional():
    pol = AdaptiveK(max_k=4, prior_weight=1e-6)
    for _ in range(50):
        pol.update(3, 3, 0.0, 0.1)  # all kept
        pol.update(3, 1, 0.0, 0.1)  # first kept, second rejected, third never judged
    a = pol.acceptance()
    assert a[0] == pytest.approx(1.0, abs=1e-3)
    assert a[1] == pytest.approx(0.5, abs=0.05)
    assert a[2] == pytest.approx(1.0, abs=1e-3)  # conditional on reaching it
    assert a[3] == pytest.approx(a[2])  # never reached: borrows the last estimate
    assert pol.expected_tokens(3) == pytest.approx(1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2])
    assert pol.expected_tokens(0) == 1.0


def test_policy_bounds_and_factory():
    with pytest.raises(ValueError):
        AdaptiveK(max_k=0)
    with pytest.raises(ValueError):
        FixedK(-1)
    assert make_adaptive(PromptLookupDrafter()).max_k == 8
    pol = AdaptiveK(max_k=3)
    ks = drive(pol, Machine([0.99], draft_step=0.0001), 100)
    assert max(ks) == 3 and ks.count(3) > 80


def test_fallback_in_the_real_loop_counts_tokens_by_mode_and_stays_lossless():
    """A same-size, unrelated draft (no acceptance, as slow as the target): the
    adaptive policy stops drafting; stats count plain vs speculative tokens; output
    is plain decoding's."""
    target = tiny_models.make_model("llama", seed=11)
    other = tiny_models.make_model("llama", seed=99)
    prompt = [9, 8, 7]
    plain = [t for t, _ in SpeculativeDecoder(target).generate(list(prompt), max_tokens=60)]
    dec = SpeculativeDecoder(target, ModelDrafter(other), AdaptiveK(max_k=8))
    stats = GenerationStats()
    got = [t for t, _ in dec.generate(list(prompt), max_tokens=60, stats=stats)]
    assert got == plain
    assert stats.tokens_plain + stats.tokens_speculative == 60
    assert stats.tokens_plain > 40, stats.k_history
    assert any(n.startswith("fallback") for n in stats.notes)
    assert "fell back to plain decoding" in stats.summary()
