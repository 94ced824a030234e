"""What drafting on hope may cost: the exploration ledger of the per-token policy
(costs/draft_length.py, `PerToken`).

A round is *exploring* when the evidence says that drafting does not pay -- neither
the mean acceptance (for a first draft token) nor the generation's recent rounds
(their tokens against their price: a tree can pay where a lone token does not) --
and it drafts only on the optimistic bound, or as a probe after a fallback.  Such a
round hopes for its first token only (its first level, in a tree) and bets on the
mean after it: a try is a test, not a wager on a draft not yet seen (at the prior,
the bound is 1.0).  Where a round is dear (a slow draft step, a steep verify curve)
each failed try costs most of a plain step, and in a short reply two or three of
them cost more than drafting can win back.  So exploring is paid from a ledger, per
generation:

* every token emitted credits PROBE_SHARE of a plain step (plain decoding's price of it);
* an exploring round credits what it won over plain decoding (tokens emitted less its
  predicted price), a debit when it lost;
* an exploring round is taken only while the balance covers its expected loss: one
  draft token's price -- a draft forward, with the positions the draft's cache lacks
  after plain rounds (its catch-up), and one more verify position -- less the mean
  acceptance, in plain steps.

The first round of a generation is tried regardless (a new prompt may suit the
drafter) and charged.  After it, exploring so costs at most about PROBE_SHARE of the
generation's plain work plus what exploring has won.  Where the catch-up grows faster
than PROBE_SHARE a token (a dear draft, or host time per position), the ledger never
covers a probe after a fallback: the policy then probes every PROBE_MAX plain tokens
(costs/draft_length.py), so a long reply still notices a change of text.  Rounds the
evidence says pay are never held back nor charged.  Prices are the cost model's, so
nothing here reads a clock.
"""

from __future__ import annotations

PROBE_SHARE = 0.02  # of each emitted token's plain step: what exploring may cost where it never pays
GAIN_DECAY = 0.9  # per round: the generation's recent gain over plain decoding follows the text


def exploring(policy) -> bool:
    """Is `policy`'s current round a try on hope (False for a policy without a ledger)?"""
    ledger = getattr(policy, "ledger", None)
    return ledger is not None and ledger.exploring


class Ledger:
    """One generation's exploration account (`PerToken.ledger`)."""

    def __init__(self):
        self.start()

    def start(self) -> None:
        self.balance, self.first, self.lag = 0.0, True, 0
        self.exploring, self.catchup = False, 0.0
        self.gain = 0.0  # this generation's recent rounds: tokens less their price (decayed)

    def paying(self) -> bool:
        """Have this generation's recent rounds, as priced, beaten plain decoding?"""
        return self.gain > 0

    def catchup_cost(self, policy) -> float:
        """What the next draft forward costs beyond one position: it re-feeds the `lag`
        tokens emitted since the draft last ran (0 for a drafter without a model)."""
        if not any(step is None for step, _ in policy.sources) or not self.lag:
            return 0.0
        cm = policy.cost
        return cm.draft_width(self.lag + 1) - cm.draft_width(1)

    def expected_loss(self, policy) -> float:
        """Plain steps a one-token exploring round is expected to lose against plain decoding
        (at the mean acceptance), for the source that loses least."""
        rnd, cm = policy.round(1), policy.cost  # a one-token round (not draft_length.Round: no import circle)
        best = None
        for step, lookup in policy.sources:
            a = policy.mean_acceptance(lookup)
            price = (cm.draft_step + self.catchup_cost(policy) if step is None else step) + cm.extra(2)
            loss = price + rnd.refeed_risk(a) - a
            best = loss if best is None else min(best, loss)
        return best

    def allows(self, policy) -> bool:
        """May the next round explore?"""
        return self.first or self.balance >= self.expected_loss(policy)

    def begin(self, policy, exploring: bool) -> None:
        """The round about to run drafts (`exploring`: on hope) or not (both False: plain)."""
        self.exploring = exploring
        self.catchup = self.catchup_cost(policy) if exploring else 0.0

    def settle(self, rnd, tokens: int) -> None:
        """After a round: `rnd` its Round or TreeBudget (`t`: its predicted price in plain
        steps), `tokens` what it emitted (0: not counted)."""
        self.balance += PROBE_SHARE * tokens
        won = tokens - (rnd.t + self.catchup) if rnd.k else 0.0
        if tokens:
            self.gain = GAIN_DECAY * self.gain + won
        if self.exploring and tokens:
            self.balance += won
        self.first, self.exploring, self.catchup = False, False, 0.0
        self.lag = self.lag + max(tokens, 1) if rnd.k == 0 else 0
