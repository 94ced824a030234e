"""Trees or chains, round by round, by the speed each is measured to give.

The tree budget (tree_budget.py) sizes a tree from the calibrated cost model
and the acceptance observed per draft confidence; where those estimates are off
for a text (a sibling rarely taken, a chain that would have gone deeper), a
round of chains gives more tokens per second than a tree.  So with trees on by
default, a generation measures both: its first rounds verify trees, then one a
chain; afterwards each round takes the kind with the higher recent rate (tokens
emitted per second of drafting and verifying, older rounds decaying; chains need
a margin, SWITCH_MARGIN, since trees are what the cost model chose),
and after REVISIT_EVERY rounds (times the squared ratio of the two rates: a kind
far behind is revisited rarely) the other kind is tried again (a single round is
a noisy measure: the revisits correct an early wrong choice), so that a change in
the text (a repetitive stretch where lookup spines make trees pay) is seen.
Both kinds are exact, so the choice changes speed only, never the output.

`--tree` forces trees every round, `--no-tree` chains; the stats count tree
rounds (`tree_rounds` of `target_passes`).
"""

from __future__ import annotations

CHAIN_ROUND = 2  # the round (from 0) that first verifies a chain; the rounds before it, trees
SWITCH_MARGIN = 1.1  # chains take over only when measured this much faster than trees
REVISIT_EVERY = 5  # then the slower kind is tried again after this many rounds (more when far behind)
DECAY = 0.75  # weight of a kind's earlier rounds against its latest (the text drifts)


class TreeOrChain:
    """Which kind the next round verifies, from the rounds measured so far."""

    def __init__(self):
        self.rounds = 0
        self._sums = {True: [0.0, 0.0], False: [0.0, 0.0]}  # kind -> decayed [tokens, seconds]
        self._since = {True: 0, False: 0}  # kind -> rounds since it was last run

    def rate(self, tree: bool) -> float | None:
        """Recent tokens per second of `tree` rounds (None before one is measured)."""
        tokens, seconds = self._sums[tree]
        return tokens / seconds if seconds > 0 else None

    def faster(self) -> bool:
        """True unless chains measure SWITCH_MARGIN times faster than trees: trees are
        the cost model's choice, chains have to prove themselves."""
        t, c = self.rate(True), self.rate(False)
        return c is None or t is None or c < SWITCH_MARGIN * t

    def tree_next(self) -> bool:
        if self.rounds <= CHAIN_ROUND:
            return self.rounds < CHAIN_ROUND
        best = self.faster()
        slow, fast = self.rate(not best), self.rate(best)
        ratio = fast / slow if slow and fast else 1.0
        # revisit the slower kind after REVISIT_EVERY rounds, later the further behind it is
        return (not best) if self._since[not best] >= REVISIT_EVERY * ratio * ratio else best

    def observe(self, tree: bool, tokens: int, seconds: float) -> None:
        """A drafted round of `tree` kind emitted `tokens` in `seconds`."""
        s = self._sums[tree]
        s[0], s[1] = s[0] * DECAY + tokens, s[1] * DECAY + max(seconds, 1e-9)
        self.rounds += 1
        self._since[tree], self._since[not tree] = 0, self._since[not tree] + 1
