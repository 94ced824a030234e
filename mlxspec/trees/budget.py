"""How big a round's draft tree grows: the per-token rule of costs/draft_length.py,
generalised from a chain to a tree.

Every candidate node has a value v: the estimated probability that the target
accepts the whole path from the root to it (the product of its ancestors'
estimates).  A first child's estimate is the acceptance observed for drafts of
its parent's confidence (the draft's top probability there); a later sibling's is
its own draft probability, scaled by how often siblings were observed to be
taken.  The tree expects E = 1 + sum(v) tokens for T plain steps of time (draft
forwards paid + a verify pass over all its positions), and grows exactly while
a step's marginal rate beats the bar B = min(R, E/T): the tree's average rate, or
the generation's long-run rate R where that is lower (costs/draft_length.py):

* `include`: a drafted candidate joins the tree if  v / (extra verify cost) >= B;
* `expand`:  a node is fed to the draft (to propose its children) if
  v * a / (draft cost + extra verify cost) >= B, where a is the (optimistic) mean acceptance
  of a draft and the draft cost is the width increment of a batched draft
  forward (nodes expanded together share one pass), by the draft's own width
  curve (cost_model.CostModel.draft_width).

Both look ahead along depth as the chain rule does (draft_length.pays_ahead): a
candidate on the best path, or the first node fed at a level, also counts the
deeper tokens it leads to, at the mean acceptance; further siblings and lookup
branches are judged on their own.

* `select`: once the tree is grown (greedy), the target verifies its best m nodes
  by value, m maximising E - B * T over the drafted tree (the draft's forwards are
  paid by then).  A node taken for the deeper ones it was expected to lead to, which
  the draft did not then propose, can be worth less than its verify position: on a
  CPU, where the pass's cost by width is flat in places and steep in others, the
  lookahead grows through the flat part (measured with benchmarks/priced_rounds.py:
  1-6 % more per plain step on four of five code prompts, the fifth unchanged).

The draft's top tokens are judged first, all the way down (trees/drafter.py defers
the siblings), so a sibling is priced at the positions after them.

With one child per node this is the chain rule exactly; siblings only enter when
the cost model says that a wider verify pass pays for them (on a GPU, where width
is nearly free, trees grow wide; on a CPU they stay close to chains).
"""

from __future__ import annotations

from ..costs.draft_length import bar, pays_ahead
from ..costs.exploration import exploring

MAX_BRANCH = 3  # children proposed per expanded node
MAX_TREE_NODES = 32  # verify width bound (with the pending token: 33 positions)


class TreeBudget:
    def __init__(self, policy, max_depth: int, max_nodes: int = MAX_TREE_NODES):
        self.policy, self.k = policy, max_depth
        self.max_nodes = max_nodes
        self.nodes, self.kept = 0, 0
        self.e, self.t = 1.0, 1.0
        self.draft = 0.0  # draft forwards paid (plain steps)
        self.rate = policy.rate() if hasattr(policy, "rate") else None  # the bar, as for chains (costs/draft_length.py)
        self.stop_reason = "cap"

    @property
    def cost(self):
        return self.policy.cost

    def first_child(self, confidence: float) -> float:
        return self.policy.acceptance(confidence)

    def sibling(self, probability: float) -> float:
        return min(1.0, probability * self.policy.sibling_scale())

    def lookup_child(self, confidence: float, agree: bool) -> float:
        """A spine (lookup) token's estimate, given the draft's top probability at its
        parent and whether the draft's top token is that same token: the better of the
        two sources' estimates where they agree; the lookup's, discounted by the draft's
        confidence in another token, where they do not."""
        lookup = self.policy.acceptance(None)
        return max(lookup, self.first_child(confidence)) if agree else lookup * (1.0 - confidence)

    def lookup_feed(self, pending: int, count: int) -> int:
        """How many of a lookup continuation's first `count` tokens to feed with a
        draft forward `pending` positions wide without them (the round's first, or a
        level's).  Each one held saves a draft step; it costs the width it adds to that
        forward (`_draft_width`, as for a level's extra nodes).  Feed while the chance
        that all of them hold, at the lookup's observed acceptance, beats that width."""
        a, v, n, cm = self.policy.acceptance(None), 1.0, 0, self.cost
        while n < min(count, self.k, self.max_nodes):
            v *= a
            if v < cm.draft_curve(pending + n + 1) - cm.draft_curve(pending + n):
                break
            n += 1
        self._paid(self._draft_width(pending, pending + n))
        return n

    def _paid(self, draft: float) -> None:
        self.t += draft
        self.draft += draft

    def _draft_width(self, before: int, after: int) -> float:
        """What widening a draft forward from `before` to `after` positions costs (0
        before: the forward itself), by the draft's own curve (costs/cost_model.py)."""
        cm = self.cost
        return cm.draft_width(after) - (cm.draft_width(before) if before else 0.0)

    def _later(self, j: int) -> float:
        """The cost of the j-th node below the next one on a path (for pays_ahead)."""
        return self.cost.draft_step + self.cost.extra(self.nodes + 2 + j)

    def include(self, v: float, depth: int | None = None) -> bool:
        """`depth`: the candidate's depth, to look ahead below it (None: judge it alone)."""
        if self.nodes >= self.max_nodes:
            self.stop_reason = "cap"
            return False
        extra = self.cost.extra(self.nodes + 2)
        horizon = 1 if depth is None else self.k - depth + 1
        if not (self.policy.forced and self.nodes == 0) and not pays_ahead(
                v, 1.0, self.policy.mean_acceptance(), extra, self._later, *bar(self.t, self.e, self.rate), horizon):
            self.stop_reason = "confidence"
            return False
        self.nodes += 1
        self.e += v
        self.t += extra
        return True

    def expand(self, values: list, depth: int) -> int:
        """How many of the nodes with `values` (sorted, highest first), just added
        at `depth`, to feed to the draft for children."""
        if depth >= self.k or self.nodes >= self.max_nodes:
            self.stop_reason = "cap"
            return 0
        pol, n = self.policy, 0
        # as Round.more: a try on hope (costs/exploration.py) hopes for its first level only
        a, a_later = pol.mean_acceptance(optimistic=not (depth and exploring(pol))), pol.mean_acceptance()
        for v in values:
            step = self._draft_width(n, n + 1)
            forced = pol.forced and self.nodes == 0
            horizon = self.k - depth if n == 0 else 1  # the best node leads the way down
            if not forced and not pays_ahead(v, a, a_later, step + self.cost.extra(self.nodes + 2), self._later,
                                             *bar(self.t, self.e, self.rate), horizon):
                break
            self._paid(step)
            n += 1
        if not n:
            self.stop_reason = "cost"
        return n

    def select(self, values: list) -> int:
        """How many of the tree's nodes, by `values` sorted best first, to verify: the
        count m that maximises E_m - B * T_m (E_m = 1 + the best m values, T_m = the draft
        forwards paid + a verify pass over m + 1 positions), B the long-run rate R where
        the best round rate is above it, else that best rate (then m maximises E/T)."""
        cm, e = self.cost, [1.0]
        for v in values:
            e.append(e[-1] + v)
        t = [self.draft + cm.verify_width(m + 1) for m in range(len(e))]
        b = max(x / y for x, y in zip(e, t))
        if self.rate is not None:
            b = min(b, self.rate)
        return max(range(len(e)), key=lambda m: (e[m] - b * t[m], m))
