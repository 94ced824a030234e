"""What the per-token policy (costs/draft_length.py) has learnt of the draft's
acceptance: the mean acceptance of each source (`Mean`) and the acceptance of a
draft token by its confidence (`Calibration`: the draft's top probability at that
position, in buckets).

How often the target keeps a draft token of a given confidence depends on how the
token is chosen.  Greedy, the target keeps it when both argmaxes agree, and a
draft that puts c on its top token is right about that at least as often as c
(under-confident): the greedy table starts from acceptance = c.  Sampling, the
draft draws its token and the target keeps it with probability min(1, p/q) (or,
coupled, when the same noise picks the same token), and the draft is
over-confident between about 0.75 and 0.98: at 0.80-0.90 the default pair's draft
is kept 0.68-0.78 of the time at T = 0.7, greedy 0.91-1.00.  The sampled table
starts from that measured curve (SAMPLED_PRIOR: benchmarks/draft_calibration.py
--temp 0.7 --seeds 0,100, code, chat and creative pooled, at most the confidence and
rising with it: the 0.98-0.99 band, 0.90 of 60, left out; docs/profiles.md), between
its points by straight lines.  Each bucket's prior counts PRIOR_WEIGHT outcomes, so
a pair calibrated otherwise soon shows it.  Each mode keeps a table of its own, so a
Session or server that switches temperature never prices one mode's drafts with the
other's outcomes.  Old outcomes fade (DECAY), so the tables follow the text.
"""

from __future__ import annotations

from bisect import bisect_right

BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)  # confidence bucket edges
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each prior
DECAY = 0.98  # older observations fade, so acceptance follows the text
Z_80 = 1.28  # one-sided 90 % normal quantile: the optimistic bound on the mean acceptance that `more` bets on
LOOKUP_PRIOR = 0.5  # a deterministic proposal's (prompt lookup: no confidence)
# (confidence, share kept) of the default pair's draft at T = 0.7 (the module's docstring)
SAMPLED_PRIOR = ((0.0, 0.0), (0.37, 0.37), (0.6, 0.55), (0.75, 0.68), (0.85, 0.71), (0.93, 0.83), (0.966, 0.93),
                 (0.995, 0.995), (1.0, 1.0))


class Mean:
    """A source's mean acceptance: `kept` of `seen` outcomes (decayed, the prior
    included) and the `evidence` behind its optimistic bound (the prior's weight plus
    every outcome since, not decayed)."""

    def __init__(self, prior: float):
        self.kept, self.seen, self.evidence = prior * PRIOR_WEIGHT, PRIOR_WEIGHT, PRIOR_WEIGHT

    def add(self, kept: bool) -> None:
        self.kept, self.seen, self.evidence = DECAY * self.kept + kept, DECAY * self.seen + 1, self.evidence + 1

    def halve(self) -> None:
        """Forget half of it (a probe's outcomes then count)."""
        self.kept, self.seen, self.evidence = self.kept / 2, self.seen / 2, self.evidence / 2

    def value(self, optimistic: bool = False) -> float:
        a = self.kept / self.seen
        return min(1.0, a + Z_80 * (a * (1 - a) / self.evidence) ** 0.5) if optimistic else a


def prior(confidence: float, sampled: bool) -> float:
    """Acceptance expected of a draft token of this confidence before any outcome
    (the module's docstring): c greedy, SAMPLED_PRIOR's curve sampling."""
    if not sampled:
        return confidence
    confidence = min(max(confidence, 0.0), 1.0)
    pts = SAMPLED_PRIOR
    j = next(i for i in range(1, len(pts)) if confidence <= pts[i][0])
    (c0, a0), (c1, a1) = pts[j - 1], pts[j]
    return a0 + (a1 - a0) * (confidence - c0) / (c1 - c0)


class Calibration:
    """Acceptance by confidence bucket (the last bucket: deterministic proposals), one
    table per sampling mode; `kept` and `seen` are the current mode's (`use`)."""

    def __init__(self):
        centers = [(lo + hi) / 2 for lo, hi in zip((0.0,) + BUCKETS, BUCKETS + (1.0,))]
        self.tables = {sampled: ([prior(c, sampled) * PRIOR_WEIGHT for c in centers] + [LOOKUP_PRIOR * PRIOR_WEIGHT],
                                 [PRIOR_WEIGHT] * (len(centers) + 1)) for sampled in (False, True)}
        self.use(False)

    def use(self, sampled: bool) -> None:
        """Price and learn from now on in this mode (greedy: False)."""
        self.kept, self.seen = self.tables[sampled]

    def bucket(self, confidence: float | None) -> int:
        return len(self.seen) - 1 if confidence is None else bisect_right(BUCKETS, confidence)

    def acceptance(self, confidence: float | None) -> float:
        b = self.bucket(confidence)
        return self.kept[b] / self.seen[b]

    def add(self, confidence: float | None, kept: bool) -> None:
        b = self.bucket(confidence)
        self.kept[b] = DECAY * self.kept[b] + kept
        self.seen[b] = DECAY * self.seen[b] + 1
