"""Synthetic rounds for draft-length policies (test_draft_length.py, test_hybrid_policy.py).

A synthetic round: the draft's confidence for each next token is drawn from a
distribution; the token is then kept by the target with probability
`accept(confidence)`.  The policy sees only confidences and outcomes, as in the
real loop; speed is E[tokens] / E[cost] with a cost model's own numbers, so these
tests measure the rule, not a clock.  `Recurrent` adds what a recurrent target
pays for rejections (core/recurrent.py), pile-ups over back-to-back rejections included."""

import numpy as np

from mlxspec.costs.cost_model import CostModel, merge_limit
from mlxspec.costs.draft_length import Round


def costs(draft_step, slope=0.06, width=17):
    return CostModel(draft_step, [1 + slope * (w - 1) for w in range(1, width + 1)])


def uniform(lo, hi):
    return lambda rng: rng.uniform(lo, hi)


class Recurrent:
    """The re-fed positions a recurrent target carries from pass to pass: after a
    rejection (j of n drafts kept) the next pass re-feeds j + 1 positions plus those
    that rode along in this one; beyond merge_limit they are a call of their own
    (and a checkpoint after it), so a rejection then starts a new pile."""

    def __init__(self, cm):
        self.cm, self.limit, self.r = cm, merge_limit(cm), 0
        self.refed = self.passes = 0

    def riding(self) -> int:
        return self.r if self.r <= self.limit else 0

    def pass_cost(self, n: int) -> float:
        """A verify pass over the pending token and n drafts, with what it re-feeds."""
        cm, r = self.cm, self.r
        if r > self.limit and n:
            return cm.verify_width(r) + cm.verify_width(1 + n)
        return cm.verify_width(r + 1 + n)

    def settle(self, n: int, kept: int) -> None:
        self.r = self.riding() + kept + 1 if kept < n else 0
        self.refed += self.r
        self.passes += 1


class Text:
    """Confidences of successive draft tokens and whether the target keeps them."""

    def __init__(self, confidence, accept, seed=0):
        self.confidence, self.accept = confidence, accept
        self.rng = np.random.default_rng(seed)

    def run(self, policy, rounds, stats=None, cm=None, target=None):
        """Drive `policy` for `rounds` rounds; returns (tokens, cost, drafted per round).
        Costs are `cm`'s (default: the policy's own, or a FixedK's `true_cost`);
        `target`: a Recurrent, which also reports to the policy as the decoder does."""
        cm = cm if cm is not None else policy_cost(policy)
        tokens = cost = 0.0
        lengths = []
        for _ in range(rounds):
            k = policy.choose()
            if k and target is not None and hasattr(policy, "observe_refeed"):
                policy.observe_refeed(target.riding())
            rnd = policy.round(k) if k else Round(None, 0)
            confs = []
            step = 0
            while k and rnd.more():
                step += 1
                c = self.confidence(self.rng)
                if not rnd.offer(c):
                    break
                confs.append(c)
            kept = 0
            while kept < len(confs) and self.rng.random() < self.accept(confs[kept]):
                kept += 1
            outcomes = list(zip(confs, [True] * kept + [False]))[: kept + 1]
            policy.update(rnd, outcomes, kept + 1)
            if stats is not None:
                stats.record_round(len(confs), kept, kept + 1, rnd.stop_reason if k else "plain")
            tokens += kept + 1
            cost += cm.draft_step * step
            if target is None:
                cost += cm.verify_width(len(confs) + 1)
            else:
                cost += target.pass_cost(len(confs))
                target.settle(len(confs), kept)
            lengths.append(len(confs))
        return tokens, cost, lengths


def reply(profile, accept, tokens=40, confidence=uniform(0.3, 0.9), seed=0, sampled=False):
    """(speed over plain, drafted per round) of one reply of `tokens` tokens under a shipped
    profile's costs (a plain step is one; the draft's catch-up after plain rounds priced
    too), by a fresh PerToken policy; `sampled`: a generation at T > 0 (its prior)."""
    from mlxspec.core.stats import GenerationStats
    from mlxspec.costs import profiles
    from mlxspec.costs.draft_length import PerToken

    cm = profiles.profile_cost(profile)
    pol = PerToken(cm, 12)
    pol.start(GenerationStats(), sampled=sampled)
    text = Text(confidence, accept, seed=seed)
    emitted, cost, lengths, lag = 0, 0.0, [], 0
    while emitted < tokens:
        n, c, drafted = text.run(pol, 1)
        c += (cm.draft_width(lag + 1) - cm.draft_width(1)) if drafted[0] and lag else 0.0
        lag = 0 if drafted[0] else lag + 1
        emitted, cost = emitted + n, cost + c
        lengths += drafted
    return emitted / cost, lengths


def policy_cost(policy):
    return policy.cost if hasattr(policy, "cost") else policy.true_cost
