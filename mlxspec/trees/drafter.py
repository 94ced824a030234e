"""Growing a draft tree with the draft model, level by level (EAGLE-2's dynamic
trees, with the size rule of trees/budget.py), prompt lookup's continuation first.

The draft feeds what it lacks of the history, and with it -- in the same
forward -- prompt lookup's continuation (the spine): where the text repeats
earlier text, one draft forward then scores a whole run of tokens instead of one
token per forward.  The spine's tokens become the tree's first children, one-hot
proposals (q = None), while the draft's own opinion of each (its top token
there, and how sure it is) sets their estimate; the draft's other candidates at
each spine node are their siblings.  From every node whose draft distribution
is known, the tree then grows as without lookup: each level, the nodes chosen
for expansion are fed to the draft together, as one tree block (trees/attention.py:
one batched forward, each node seeing only its ancestors; lookup's continuation
after the best of them goes in too, a spine under that node); each gets up to
MAX_BRANCH children, ranked by estimated value; the tree takes the candidates
worth verifying and the best of those are expanded next.

Siblings wait (DEFER_SIBLINGS): while the draft's own top tokens (and lookup's)
still grow the tree, the other candidates are only set aside; once the top tokens
stop, the siblings are weighed, best first, at the widths the tree has reached,
and the tree grows on from those taken (their own siblings join at once).  Taken
level by level with the rest, a level's siblings took the verify pass's cheap
positions and a deeper top token then looked too dear: on the chat suite the trees
drafted shallower than chains did (2.75 tokens per pass against 2.78, priced
rounds at 64 tokens; deferred: 2.94).  Under sampling, whether a sibling is drawn
then depends on the first child's drawn token and its subtree, never on the
sibling's own token: after a rejection, the rest of the rule yields the residual
for any proposal, so the output is still exactly p.  Greedy: children are
the draft's top tokens.  Sampling: children are drawn from the draft's processed
distribution q without replacement (each keeps the renormalised q it was drawn
from, for the acceptance rule; a spine token already there is removed from q
first), and a child is drawn only after deciding to add it -- the decision looks
at q's sorted probabilities, never at the drawn token, which would bias the
proposals.

Greedy trees are then cut to the nodes worth verifying (`_select`: the best by
value, as many as tree_budget.TreeBudget.select finds pay).  Sampled trees are
not: whether a node pays depends on its descendants, hence on its drawn token.

After the round `commit(path)` keeps, in the draft's cache, the accepted nodes it
has fed; the next round's `sync` feeds the rest, as with chains.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .. import cpu
from ..errors import MlxspecError
from ..core.sampling import SamplingParams, process_logits
from ..core.token_ids import fit_rows
from .tree import DraftTree
from .attention import TreeBlock
from .budget import MAX_BRANCH, TreeBudget

DEFER_SIBLINGS = True  # siblings are weighed once the draft's top tokens stop growing the tree


def top_columns(rows: np.ndarray, k: int) -> np.ndarray:
    """Each row's k largest columns (fewer if it has fewer), largest first, ties to the
    lower column: k passes of argmax.  A tree level needs its nodes' top MAX_BRANCH of the
    draft's 65,536-row distribution; here NumPy's argpartition took 0.5 ms a row, the
    argmax passes 0.04 ms.  A NaN is taken first (as argmax takes it), so the caller's
    NaN check sees it."""
    k = min(k, rows.shape[-1])
    left = np.array(rows, dtype=rows.dtype, copy=True)
    at = np.arange(rows.shape[0])
    top = np.empty((rows.shape[0], k), dtype=np.intp)
    for j in range(k):
        top[:, j] = np.argmax(left, axis=-1)
        for r in np.flatnonzero(np.isneginf(left[at, top[:, j]])):  # only -inf left: the lowest column not taken
            top[r, j] = next(c for c in range(rows.shape[-1]) if c not in top[r, :j])
        left[at, top[:, j]] = -np.inf
    return top


class TreeDraft:
    """One round's tree from a ModelDrafter, and what its cache must keep afterwards."""

    def __init__(self, drafter, history: list[int], params: SamplingParams, rng: np.random.Generator | None,
                 budget: TreeBudget, lookup=None, coupling=None):
        """`lookup`: a PromptLookupDrafter, whose continuations are the tree's spines.
        `coupling`: coupled sampling (core/coupled.py): children are the draft's top tokens
        by log q + g_position, as greedy trees' are by log q, and the tree is cut as greedy."""
        self.drafter, self.params, self.rng, self.budget = drafter, params, rng, budget
        self.coupling = coupling
        self.history, self.lookup = history, lookup
        self.tree = DraftTree()
        self.fed: dict[int, int] = {}  # tree node -> draft block index
        self.depth: dict[int, int] = {-1: 0}  # tree node -> depth (the root: 0)
        self.expanded: list[int] = []  # tree nodes whose children were proposed (-1: the root)
        state = drafter.state
        pending = state.sync(history)
        self.block = TreeBlock(state)
        self._pending = m = len(pending)
        if not budget.expand([1.0], 0):
            return
        spine = self._lookup_under(-1, m)
        logits = self.block.forward(pending + spine, list(range(-1, m + len(spine) - 1)), self._width(m + len(spine)))
        self._grow(logits[m - 1:], spine)
        if params.greedy or coupling is not None:
            self._select()

    def _select(self) -> None:
        """Keep the nodes worth verifying: the best by value (the estimated chance that
        the target takes the path to them), as many as the budget selects.  A node's
        value is at most its parent's, so the best ones form a tree.  Greedy only: under
        sampling a node's descendants' values depend on its drawn token, and a
        selection that looked at them would bias the proposals."""
        value = self.tree.values()
        order = sorted(range(len(value)), key=lambda i: (-value[i], self.depth[i], i))
        m = self.budget.select([value[i] for i in order])
        if m == len(order):
            return
        self.tree, new = self.tree.only(order[:m])
        self.fed = {new[i]: b for i, b in self.fed.items() if i in new}
        self.depth = {new[i]: d for i, d in self.depth.items() if i in new}
        self.expanded = [new[i] for i in self.expanded if i in new]

    def _distributions(self, logits: mx.array, paths: list[list[int]]):
        """Per row (its tokens after the history in `paths`): (top probability, ranked
        (token, probability) candidates, q or None, the draft's top token)."""
        d, params = self.drafter, self.params
        sub = d.subset
        if params.greedy and not params.adjusts_logits:
            lp = cpu.normalise(logits if sub is not None else fit_rows(logits, d.rows))  # a subset's own ids
            if lp.dtype != mx.float32:  # a float16 / bfloat16 draft (numpy has no bfloat16)
                lp = lp.astype(mx.float32)
            mx.eval(lp)
            lp = np.array(lp, copy=False)
            top = top_columns(lp, MAX_BRANCH)
            probs = np.exp(np.take_along_axis(lp, top, axis=-1).astype(np.float64))
            ids = np.array(sub.ids, copy=False)[top] if sub is not None else top
            out = []
            for pr, tk in zip(probs.tolist(), ids.tolist()):
                ranked = sorted(zip(tk, pr), key=lambda c: -c[1])
                out.append((ranked[0][1], ranked, None, ranked[0][0]))
            return out
        contexts = [self.history + p for p in paths] if params.uses_context else None
        lp = process_logits(d.full_logits(logits), params, contexts)
        q = np.array(cpu.probabilities(lp.astype(mx.float32)), dtype=np.float64)
        out = []
        if self.coupling is not None:  # the same g_t as the target: rank by log q + g
            scores = self.coupling.perturbed(lp.astype(mx.float32), [len(self.history) + len(p) for p in paths])
            top = top_columns(np.array(scores, dtype=np.float32), MAX_BRANCH)
            for row, order in zip(q, top):
                ranked = [(int(t), float(row[t])) for t in order if row[t] > 0] or [(int(order[0]), 0.0)]
                out.append((ranked[0][1], ranked, None, ranked[0][0]))
            return out
        for row in q:
            row = row / row.sum()
            best = int(np.argmax(row))
            if params.greedy:
                order = top_columns(row[None], MAX_BRANCH)[0]
                out.append((float(row[order[0]]), [(int(t), float(row[t])) for t in order], None, best))
            else:
                top = row[top_columns(row[None], MAX_BRANCH)[0]]
                out.append((float(top[0]), [(None, float(p)) for p in top if p > 0], row, best))
        return out

    def _check(self, dists):
        if any(c != c for c, *_ in dists):
            raise MlxspecError("the draft model produced NaN logits: its weights are corrupt or overflow in "
                               "this dtype; re-convert or re-download it, or use --no-draft")

    def _path(self, node: int) -> list[int]:
        """The tokens from the root down to `node` (after the history)."""
        return [self.tree.tokens[j] for j in self.tree.path(node)]

    def _lookup_under(self, node: int, width: int) -> list[int]:
        """Prompt lookup's continuation after `node`, as much of it as is worth feeding
        in a draft forward already `width` positions wide."""
        if self.lookup is None or self.depth[node] >= self.budget.k:
            return []
        cont = self.lookup.lookup(self.history, self.budget.k - self.depth[node], self._path(node))
        return cont[: self.budget.lookup_feed(width, len(cont))]

    def _add_spine(self, parent: int, spine: list[int], spine_rows: list, fed_start: int, grown: tuple) -> None:
        """Add, as a chain under `parent`, the spine tokens the budget finds worth
        verifying.  `spine_rows[i]`: the draft's distribution after spine token i (fed
        at block index fed_start + i).  `grown` = (nodes, values, rows): the nodes whose
        draft distributions are known, `parent` among them; the added ones join."""
        tree, budget = self.tree, self.budget
        nodes, values, rows = grown
        at = nodes.index(parent)
        v, row, depth = values[at], rows[at], self.depth[parent]
        for i, tok in enumerate(spine):
            conf, _, _, best = row
            agree = best == tok
            a = budget.lookup_child(conf, agree)
            if depth + i >= budget.k or not budget.include(v * a, depth + i + 1):
                return
            # a token the draft would have proposed first counts as the draft's (its confidence bucket)
            parent = tree.add(tok, parent, None, conf if agree else None, a, conf if agree else None, lookup=True)
            v, row = v * a, spine_rows[i]
            self.fed[parent], self.depth[parent] = fed_start + i, depth + i + 1
            nodes.append(parent)
            values.append(v)
            rows.append(row)

    def _grow(self, logits: mx.array, spine: list[int]):
        """From the root (its pending tokens and `spine` fed, `logits` from the last
        pending row on), level by level.  Each level feeds the chosen nodes, and under
        the best of them lookup's continuation after it (a spine of its own)."""
        budget, tree = self.budget, self.tree
        dists = self._distributions(logits, [spine[:i] for i in range(len(spine) + 1)])
        self._check(dists)
        grown = ([-1], [1.0], dists[:1])
        self._add_spine(-1, spine, dists[1:], self._pending, grown)
        later, deferring = [], DEFER_SIBLINGS  # siblings of the draft's top tokens, for when those stop
        while True:
            nodes, values, dists = grown
            self.expanded.extend(nodes)
            cands = []  # (value, parent, rank, token or None, confidence, q, estimate, draft probability)
            for node, v, (conf, ranked, q, best) in zip(nodes, values, dists):
                if (self.drafter.p_min > 0 and conf < self.drafter.p_min) or self.depth[node] >= budget.k:
                    continue
                there = [tree.tokens[c] for c in tree.children(node)]  # a spine token
                if there:  # the draft's candidates besides it
                    ranked = [c for c in ranked if c[0] not in there] if ranked[0][0] is not None \
                        else ranked[1:] if best in there else ranked
                for i, (tok, p) in enumerate(ranked):
                    r = len(there) + i
                    a = budget.first_child(conf) if r == 0 else budget.sibling(p)
                    own = i == 0 and best not in there  # the draft's own top token (sampling: its first draw)
                    (cands if own or not deferring else later).append((v * a, node, r, tok, conf, q, a, p))
            growable, n = self._to_expand(self._add(cands))
            if not n and later:  # the top tokens stopped: the siblings' turn, and from now on they branch freely
                growable, n = self._to_expand(self._add(later))
                later, deferring = [], False
            if not n:
                return
            chosen = [node for _, node in growable[:n]]
            base = len(self.block)
            sub = self._lookup_under(chosen[0], n)
            parents = [self._block_index(tree.parents[c]) for c in chosen]
            parents += [base] + list(range(base + n, base + n + len(sub) - 1)) if sub else []
            logits = self.block.forward([tree.tokens[c] for c in chosen] + sub, parents, self._width(n + len(sub)))
            for i, c in enumerate(chosen):
                self.fed[c] = base + i
            paths = [self._path(c) for c in chosen]
            dists = self._distributions(logits, paths + [paths[0] + sub[:i + 1] for i in range(len(sub))])
            self._check(dists)
            grown = (chosen, [v for v, _ in growable[:n]], dists[:n])
            self._add_spine(chosen[0], sub, dists[n:], base + n, grown)

    def _to_expand(self, added: list) -> tuple[list, int]:
        """Of the nodes just `added` ((value, node)), those that can grow, best first, and
        how many of them the budget feeds to the draft."""
        budget = self.budget
        growable = sorted(((v, c) for v, c in added if self.depth[c] < budget.k), key=lambda c: -c[0])
        if added and not growable:
            budget.stop_reason = "cap"
        return growable, budget.expand([v for v, _ in growable], self.depth[growable[0][1]]) if growable else 0

    def _add(self, cands: list) -> list:
        """Add the candidates the budget takes, best first, each sibling only after the
        ones ranked above it; (value, node) of those added.  Candidates are
        (value, parent, rank, token or None, confidence, q, estimate, draft probability)."""
        tree, added = self.tree, []
        last_rank = {c[1]: len(tree.children(c[1])) - 1 for c in cands}
        for v, parent, r, tok, conf, q, a, p in sorted(cands, key=lambda c: (-c[0], c[1], c[2])):
            depth = self.depth[parent] + 1
            if last_rank[parent] != r - 1 or not self.budget.include(v, depth if r == 0 else None):
                continue
            last_rank[parent] = r
            q_node = None
            if q is not None:  # sampling: draw now, from q without the earlier siblings
                q_node = self._remaining(parent, q)
                if q_node is None:
                    continue
                tok = int(self.rng.choice(q_node.size, p=q_node))
            node = tree.add(tok, parent, q_node, conf, a, p)
            self.depth[node] = depth
            added.append((v, node))
        return added

    def _width(self, positions: int) -> int:
        """The width a draft forward over `positions` runs at: padded as the verify
        pass would be (where a wider pass costs less; the budget prices the draft's
        widths by its own curve, tree_budget._draft_width)."""
        return self.budget.cost.pad_width(positions)

    def _remaining(self, parent: int, q: np.ndarray):
        taken = [self.tree.tokens[c] for c in self.tree.children(parent)]
        if not taken:
            return q
        q = q.copy()
        q[taken] = 0.0
        s = q.sum()
        return q / s if s > 1e-12 else None

    def _block_index(self, node: int) -> int:
        return self._pending - 1 if node < 0 else self.fed[node]

    def commit(self, path: list[int]) -> None:
        """Keep the draft's positions for its pending tokens and the accepted nodes it fed."""
        if not len(self.block):
            return  # nothing was fed
        keep = list(range(self._pending))
        for node in path:
            if node not in self.fed:
                break
            keep.append(self.fed[node])
        self.block.commit(keep)
