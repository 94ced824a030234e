"""Draft-length policies: how many tokens to draft, decided token by token.

Each round the loop asks the policy for a `Round`; the drafter asks the round,
before each draft step, whether one more step is worth it (`more`), and after
it, whether to keep the token it produced (`offer`, with the draft's
confidence: its top probability at that position -- never the drawn token's own
probability, on which a refusal would bias the proposals under sampling).  `FixedK` drafts exactly k.

`PerToken` (`--num-draft auto`, the default) stops at the first token not worth
drafting.  With costs in plain target steps from the calibrated cost model
(costs/cost_model.py) -- c per draft step, V(w) for a verify pass over w positions --
a round that has kept i drafts so far expects

    E = 1 + P_1 + ... + P_i  tokens    (P_j: probability that drafts 1..j are all kept)
    T = V(i + 1) + (draft steps paid)  plain steps of time,

so the round's rate is E/T.  A next token that is kept with probability a adds
P_i * a tokens for its cost: keep going exactly while that marginal rate beats the
round's average rate,

    P_i * a / cost  >=  E / T,

which is where E/T is highest when P falls from token to token -- and when each
token costs no less than the one before.  Maximising each round's E/T is not
quite maximising the generation's rate, though: by the renewal-reward argument
(Dinkelbach), a token is worth drafting exactly while its marginal rate beats the
generation's long-run rate R, whatever this round's average.  In a round that
goes well (E/T above R: a run of confident tokens) stopping where E/T peaks leaves
tokens that would still have paid, so the bar is min(R, E/T): R is the rate of
recent rounds (tokens emitted over their predicted cost, decayed by RATE_DECAY
per round, from RATE_PRIOR).  It is never raised above the round's own E/T,
because R swings with the text (a span that copies the prompt runs at several
tokens per plain step) and a bar that high would starve the next rounds.  (Below,
"E/T" in a rule stands for that bar.)  A verify pass's cost by width is not
always convex (on a CPU, 3 positions can cost what 8 do), so the rule looks
ahead (`pays_ahead`): it goes on while drafting h more tokens raises E/T for some
h up to the cap, at the mean acceptance for the tokens after the next one; with
h = 1 that is the inequality above.  For `offer`
the draft step is already paid, so cost = V(i + 2) - V(i + 1) and a is the
acceptance observed for drafts of that confidence (costs/confidence.py: a table
of confidence buckets per sampling mode, from a = c greedy and from the draft's
measured curve at T > 0); for `more` the token is not drafted yet, so cost =
c + V(i + 2) - V(i + 1) and a is the mean acceptance observed lately, taken at
the upper end of its 80 % confidence interval (optimism under uncertainty): the
evidence behind it is thin after a few rounds -- a round that stops at one token
observes one outcome -- and an early rejection must not keep the rounds short for
the rest of a generation.  The interval's width counts every outcome (not
decayed), so on a long generation the bound closes in on the mean and costs
nothing.  (The tokens after the next, in the look-ahead, count at the mean
itself.)  No other knobs: the threshold follows from the pair's costs.

A target with recurrent layers (hybrid / state-space models, core/recurrent.py) pays
more for a rejection: its accepted positions are fed again in the next pass, and
so are the re-fed positions that rode along in this one (back-to-back rejections
pile up, cost_model.refeed_chain).  Drafting token i + 1 when i are kept risks that
with probability P_i * (1 - a), for b + i + 1 re-fed positions, so with `refeed`
that expected cost P_i * (1 - a) * R(b + i + 1) is added to the token's cost
(R: cost_model.refeed_cost).  b, the re-fed positions riding along in a pass, is
learnt from the passes the decoder reports (`observe_refeed`), starting from the
long-run figure of the pile-up chain at the acceptance and draft length seen so
far (cost_model.expected_riding).

Fallback: if even the first draft of a round is not worth its cost (a < c + V(2) - 1,
plus its re-feed risk on a recurrent target, i.e. drafting is predicted below 1x) --
judged with the same optimistic a, so that a few early rejections are not
enough -- the round is a plain step.  While that holds, a probe round drafts
anyway every `probe_wait` plain tokens (doubling after each probe that does not
pay), with half of the old evidence forgotten, so the probe counts.

Drafting on that optimism, where neither the mean acceptance nor the generation's
recent rounds say it pays, and probing are exploration, paid from a ledger
(costs/exploration.py): such a round hopes for its first token only and is taken
while PROBE_SHARE of every token emitted, plus what exploring won, covers its
expected loss.  With the calibrated model nothing depends on wall-clock time, so
a seeded sampling run gives the same tokens every time.
"""

from __future__ import annotations

from .confidence import DECAY, PRIOR_WEIGHT, Calibration, Mean
from .exploration import PROBE_SHARE, Ledger, exploring

DEFAULT_MAX_K = 12  # --num-draft-max
PROBE_EVERY, PROBE_MAX = 16, 128  # plain tokens between probes while in fallback (doubling)
RATE_PRIOR = (3.0, 2.0)  # (tokens, plain steps) behind the long-run rate before any round: 1.5x
RATE_DECAY = 0.9  # per round: the long-run rate follows the text
SIBLING_PRIOR = (1.0, 1.0)  # (taken, predicted) behind a tree's sibling scale before any sibling was verified
def bar(t: float, e: float, rate: float | None) -> tuple[float, float]:
    """(T, E) whose ratio a drafted token's marginal rate must beat: min(rate, E/T) (the
    module's docstring), or the round's own E/T without a long-run rate."""
    return (1.0, rate) if rate is not None and rate * t < e else (t, e)


def pays_ahead(p: float, a_next: float, a_later: float, next_cost: float, later_cost, rate_t: float,
               rate_e: float, horizon: int) -> bool:
    """Would drafting h more tokens, for some h <= horizon, make at least rate_e / rate_t
    tokens per plain step of what they cost (the bar, `bar`)?  The next token is kept
    with probability a_next and costs next_cost; the j-th after it a_later and
    later_cost(j) plain steps.  horizon 1: the next token alone."""
    gain = cost = 0.0
    for j in range(max(horizon, 1)):
        p *= a_next if j == 0 else a_later
        gain += p
        cost += next_cost if j == 0 else later_cost(j)
        if gain * rate_t >= cost * rate_e:
            return True
    return False


class Round:
    """Drafting decisions for one round (FixedK's rounds say yes up to k)."""

    def __init__(self, policy=None, k: int = 0, rate: float | None = None, optimistic: bool = True):
        """`rate`: the generation's long-run rate (tokens per plain step), or None to
        judge by the round's own E/T alone; `optimistic`: `more` bets on the optimistic
        bound (False: the mean)."""
        self.policy, self.k, self.rate = policy, k, rate
        self.kept, self.p, self.e = 0, 1.0, 1.0
        self.t = 1.0  # a plain step: the verify pass over one position
        self.stop_reason = "cap"
        self.optimistic = optimistic

    def more(self, step_cost: float | None = None, lookup: bool = False) -> bool:
        """Draft one more token (a draft step costing `step_cost` plain steps)?"""
        if self.kept >= self.k:
            return False
        pol = self.policy
        if pol is None or (pol.forced and self.kept == 0):
            return True
        hope = self.optimistic and not (self.kept and exploring(pol))  # a try hopes for its first token only
        a = pol.mean_acceptance(lookup, optimistic=hope)  # the bet on the next token: optimism under uncertainty
        step = pol.cost.draft_step if step_cost is None else step_cost
        cost = self.next_cost(step, a)
        if pays_ahead(self.p, a, pol.mean_acceptance(lookup), cost, self._later(step),
                      *bar(self.t, self.e, self.rate), self.horizon):
            return True
        self.stop_reason = "cost"
        return False

    def next_cost(self, step: float, a: float) -> float:
        """Plain steps the next token costs `more`: its draft step, the verify position it
        adds, and its re-feed risk when kept with probability `a`."""
        return step + self.policy.cost.extra(self.kept + 2) + self.refeed_risk(a)

    def _later(self, step: float):
        """The cost of the j-th token after the next one (for pays_ahead)."""
        return lambda j: step + self.policy.cost.extra(self.kept + 2 + j)

    @property
    def horizon(self) -> int:
        """Tokens the rule looks ahead: up to the cap; one on a recurrent target, where a
        later token's re-feed risk depends on the pile-up it would leave (kept myopic)."""
        return 1 if getattr(self.policy, "refeed", False) else self.k - self.kept

    def offer(self, confidence: float | None, step_cost: float | None = None) -> bool:
        """Keep the token just drafted (confidence = the draft's top probability at
        this position, never the drawn token's own; None for a deterministic
        proposal such as prompt lookup)?"""
        pol = self.policy
        if pol is not None:
            step = pol.cost.draft_step if step_cost is None else step_cost
            self.t += step  # paid either way
            a = pol.acceptance(confidence)
            cost = pol.cost.extra(self.kept + 2) + self.refeed_risk(a)
            if not (pol.forced and self.kept == 0) and not pays_ahead(
                    self.p, a, pol.mean_acceptance(), cost, self._later(step), *bar(self.t, self.e, self.rate),
                    self.horizon):
                self.stop_reason = "confidence"
                return False
            self.p *= a
            self.e += self.p
            self.t += cost
        self.kept += 1
        return True

    def refeed_risk(self, a: float) -> float:
        """Expected cost of the positions a rejection of the next token makes a
        recurrent target feed again (0 for attention-only targets)."""
        pol = self.policy
        if not getattr(pol, "refeed", False):
            return 0.0
        from .cost_model import refeed_cost

        return self.p * (1 - a) * refeed_cost(pol.cost, pol.riding + self.kept + 1)


class FixedK:
    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"num_draft must be >= 0, got {k}")
        self.k = k
        self.name = f"k={k}"

    def choose(self) -> int:
        return self.k

    def round(self, k: int) -> Round:
        return Round(None, k)

    def update(self, rnd: Round, outcomes: list, tokens: int = 0) -> None:
        pass


class PerToken:
    name = "auto"

    def __init__(self, cost, max_k: int = DEFAULT_MAX_K, lookup: bool = False, model: bool = True,
                 refeed: bool = False):
        """`refeed`: the target has recurrent layers (a rejection re-feeds positions)."""
        if max_k < 1:
            raise ValueError(f"num_draft_max must be >= 1, got {max_k}")
        self.cost, self.max_k, self.refeed = cost, max_k, refeed
        self.sources = ([(0.0, True)] if lookup else []) + ([(None, False)] if model else [])  # (step cost, lookup)
        if not self.sources:  # a drafter that says neither: priced as a model's drafts (never "nothing pays")
            self.sources = [(None, False)]
        self.k = max_k  # the cap, as FixedK.k
        self.calibration = Calibration()  # acceptance by confidence, per sampling mode (costs/confidence.py)
        self.mean = {False: Mean(0.6), True: Mean(0.5)}  # by source: the draft model, lookup (True)
        self.siblings = list(SIBLING_PRIOR)  # a tree's later siblings: [taken, predicted] (trees/budget.py)
        self.forced = False  # a probe: draft regardless of the rule
        self.plain_since, self.probe_wait, self.fallback = 0, PROBE_EVERY, False
        self.stats = None
        self.riding = 0.0  # re-fed positions expected to ride along in a pass (refeed only)
        self.piled = [0.0, 0.0]  # observed riding positions: decayed sum, weight
        self.drafted = [0.0, 0.0]  # drafts per drafting round: decayed sum, weight
        self.rates = list(RATE_PRIOR)  # recent rounds' tokens and predicted plain steps: decayed sums
        self.ledger = Ledger()  # what exploring may still cost (costs/exploration.py)

    def start(self, stats, sampled: bool = False) -> None:
        """A generation begins (`sampled`: at a temperature above 0, whose drafts are priced and
        learnt from in a calibration table of their own)."""
        self.stats = stats
        self.calibration.use(sampled)
        self.plain_since = self.probe_wait  # a new prompt may suit the drafter: probe at once
        self.ledger.start()

    def acceptance(self, confidence) -> float:
        return self.calibration.acceptance(confidence)

    def mean_acceptance(self, lookup: bool = False, optimistic: bool = False) -> float:
        return self.mean[lookup].value(optimistic)

    def sibling_scale(self) -> float:
        """How much more (or less) often a tree's later siblings are taken than their
        draft probability says."""
        taken, predicted = self.siblings
        return taken / predicted

    def update_siblings(self, predicted: float, taken: int) -> None:
        s = self.siblings
        s[0], s[1] = DECAY * s[0] + taken, DECAY * s[1] + predicted

    def worth_drafting(self, optimistic: bool = True) -> bool:
        """Could a first draft token be worth its cost, from any of the drafter's sources
        (at the optimistic bound on the acceptance; at its mean: does the evidence say so)?"""
        return any(Round(self, 1, optimistic=optimistic).more(step, lookup) for step, lookup in self.sources)

    def observe_refeed(self, riding: int) -> None:
        """The decoder's report for a drafting round: `riding` re-fed positions ride
        along in its pass (0 when they get a call of their own), so a rejection in it
        re-feeds them once more."""
        s = self.piled
        s[0], s[1] = DECAY * s[0] + riding, DECAY * s[1] + 1

    def expected_riding(self) -> float:
        """The re-fed positions a pass carries, as observed, with the pile-up chain's
        long-run figure (cost_model.expected_riding) as the prior."""
        if not self.refeed:
            return 0.0
        from .cost_model import expected_riding

        n, w = self.drafted
        k = round(n / w) if w else 0
        prior = expected_riding(self.cost, self.mean_acceptance(all(lk for _, lk in self.sources)), k)
        s, seen = self.piled
        return (PRIOR_WEIGHT * prior + s) / (PRIOR_WEIGHT + seen)

    def choose(self) -> int:
        self.forced = False
        self.riding = self.expected_riding()
        led, hopeful = self.ledger, self.worth_drafting()
        if led.paying() or (hopeful and self.worth_drafting(optimistic=False)):  # the evidence: it pays
            if self.fallback:
                self._note(f"resumed drafting after {self.stats.tokens_plain if self.stats else 0} plain tokens")
            self.fallback, self.probe_wait = False, PROBE_EVERY
            led.begin(self, False)
            return self.max_k
        if hopeful and led.allows(self):  # a try on hope, paid from the ledger (in a fallback too: no probe)
            led.begin(self, True)
            return self.max_k
        if not self.fallback:  # no hope, or none that the ledger can pay for
            self.fallback, self.plain_since = True, 0
            self._note(self._fallback_note(optimistic=not hopeful))
        # the ledger keeps a short reply's probes within its share; past PROBE_MAX plain tokens a long one
        # probes anyway (a catch-up of the draft's cache can grow faster than the share: profiles' host time)
        if self.plain_since >= self.probe_wait and (led.allows(self) or self.plain_since >= PROBE_MAX):
            self.forced, self.plain_since = True, 0
            self.probe_wait = min(2 * self.probe_wait, PROBE_MAX)
            for m in self.mean.values():  # so that the probe counts
                m.halve()
            led.begin(self, True)
            return self.max_k
        led.begin(self, False)
        return 0

    def _fallback_note(self, optimistic: bool = True) -> str:
        """Why the first draft token of a round does not pay, in the figures the rule used
        (`worth_drafting`: `Round.more` with p = 1 against plain decoding's one token a plain
        step, not the recent rate), for the source that came closest, so the note never
        contradicts itself.
        `optimistic` False: the bet is the mean (the optimistic one would pay, but the
        exploration ledger cannot pay for trying it)."""
        c, rnd = self.cost, Round(self, 1)
        best = None
        for step, lookup in self.sources:
            a = self.mean_acceptance(lookup, optimistic=optimistic)
            draft = c.draft_step if step is None else step
            refeed, need = rnd.refeed_risk(a), rnd.next_cost(draft, a)
            if best is None or a - need > best[0] - best[1]:
                best = (a, need, draft, refeed, lookup)
        a, need, draft, refeed, lookup = best
        more = f" + {refeed:.2f} re-feed of ~{self.riding + 1:.1f} positions after a rejection" if refeed else ""
        bet = f"(at most {a:.2f})" if optimistic else f"{a:.2f}"
        tries = "" if optimistic else f", tries on hope paid from {PROBE_SHARE:.0%} of each token's plain step"
        return (f"fallback: {'lookup' if lookup else 'draft'} acceptance {bet} is below the {need:.2f} a "
                f"draft token must reach to pay ({draft:.2f} draft + {c.extra(2):.2f} verify{more} plain steps); "
                f"plain decoding, probing after {self.probe_wait}+ tokens{tries}")

    def round(self, k: int) -> Round:
        return Round(self, k, self.rate())

    def rate(self) -> float:
        """The generation's long-run rate: tokens per plain step of recent rounds (predicted costs)."""
        tokens, steps = self.rates
        return tokens / steps

    def update(self, rnd: Round, outcomes: list, tokens: int = 0) -> None:
        """`tokens`: what the round emitted (its kept drafts and the target's token; 0:
        not counted in the long-run rate).  `outcomes`: (confidence, kept) for each
        draft up to and including the first rejected one (later drafts say nothing:
        they were never tested).  A draft step
        whose token was not worth verifying gained nothing: the mean acceptance (the
        chance that a draft step yields a kept token, which `more` bets on) counts it
        as a miss."""
        if tokens:
            r = self.rates
            r[0], r[1] = RATE_DECAY * r[0] + tokens, RATE_DECAY * r[1] + rnd.t
        self.ledger.settle(rnd, tokens)
        if rnd.k == 0:
            self.plain_since += 1
        elif self.refeed:
            d = self.drafted
            d[0], d[1] = DECAY * d[0] + getattr(rnd, "kept", 0), DECAY * d[1] + 1
        if rnd.stop_reason == "confidence" and len(outcomes) == rnd.kept and all(k for _, k in outcomes):
            outcomes = outcomes + [("refused", False)]
        for conf, kept in outcomes:
            if conf == "refused":
                self.mean[False].add(False)
                continue
            self.calibration.add(conf, kept)
            self.mean[conf is None].add(kept)

    def _note(self, text: str) -> None:
        if self.stats is not None:
            key = text.split(":")[0].split(" ")[0]
            if not any(n.startswith(key) for n in self.stats.notes):
                self.stats.notes.append(text)
