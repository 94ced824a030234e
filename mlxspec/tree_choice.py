"""Trees or chains, round by round, by the speed each is measured to give.

The tree budget (tree_budget.py) sizes a tree from the calibrated cost model
and the acceptance observed per draft confidence; where those estimates are off
for a text (a sibling rarely taken, a chain that would have gone deeper), a
round of chains gives more tokens per second than a tree.  So with trees on by
default, a generation measures both: its first rounds alternate tree, chain,
tree, ...; afterwards each round takes the kind with the higher recent rate
(tokens emitted per second of drafting and verifying, older rounds decaying),
and one round in REVISIT_EVERY tries the other kind again, so that a change in
the text (a repetitive stretch where lookup spines make trees pay) is seen.
Both kinds are exact, so the choice changes speed only, never the output.

`--tree` forces trees every round, `--no-tree` chains; the stats count tree
rounds (`tree_rounds` of `target_passes`).
"""

from __future__ import annotations

EXPLORE_ROUNDS = 6  # the first rounds alternate: tree, chain, tree, ...
REVISIT_EVERY = 6  # then one round in this many tries the kind measured slower
DECAY = 0.75  # weight of a kind's earlier rounds against its latest (the text drifts)


class TreeOrChain:
    """Which kind the next round verifies, from the rounds measured so far."""

    def __init__(self):
        self.rounds = 0
        self._sums = {True: [0.0, 0.0], False: [0.0, 0.0]}  # kind -> decayed [tokens, seconds]

    def rate(self, tree: bool) -> float | None:
        """Recent tokens per second of `tree` rounds (None before one is measured)."""
        tokens, seconds = self._sums[tree]
        return tokens / seconds if seconds > 0 else None

    def faster(self) -> bool:
        """True when trees measure at least as fast as chains (or chains are unmeasured)."""
        t, c = self.rate(True), self.rate(False)
        return c is None or (t is not None and t >= c)

    def tree_next(self) -> bool:
        if self.rounds < EXPLORE_ROUNDS:
            return self.rounds % 2 == 0
        best = self.faster()
        return (not best) if self.rounds % REVISIT_EVERY == 0 else best

    def observe(self, tree: bool, tokens: int, seconds: float) -> None:
        """A drafted round of `tree` kind emitted `tokens` in `seconds`."""
        s = self._sums[tree]
        s[0], s[1] = s[0] * DECAY + tokens, s[1] * DECAY + max(seconds, 1e-9)
        self.rounds += 1
