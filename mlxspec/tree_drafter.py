"""Growing a draft tree with the draft model, level by level (EAGLE-2's dynamic
trees, with the size rule of tree_budget.py), prompt lookup's continuation first.

The draft feeds what it lacks of the history, and with it -- in the same
forward -- prompt lookup's continuation (the spine): where the text repeats
earlier text, one draft forward then scores a whole run of tokens instead of one
token per forward.  The spine's tokens become the tree's first children, one-hot
proposals (q = None), while the draft's own opinion of each (its top token
there, and how sure it is) sets their estimate; the draft's other candidates at
each spine node are their siblings.  From every node whose draft distribution
is known, the tree then grows as without lookup: each level, the nodes chosen
for expansion are fed to the draft together, as one tree block (tree_attention.py:
one batched forward, each node seeing only its ancestors); each gets up to
MAX_BRANCH children, ranked by estimated value; the tree takes the candidates
worth verifying and the best of those are expanded next.  Greedy: children are
the draft's top tokens.  Sampling: children are drawn from the draft's processed
distribution q without replacement (each keeps the renormalised q it was drawn
from, for the acceptance rule; a spine token already there is removed from q
first), and a child is drawn only after deciding to add it -- the decision looks
at q's sorted probabilities, never at the drawn token, which would bias the
proposals.

After the round `commit(path)` keeps, in the draft's cache, the accepted nodes it
has fed; the next round's `sync` feeds the rest, as with chains.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .errors import MlxspecError
from .sampling import SamplingParams, process_logits
from .tree import DraftTree
from .tree_attention import TreeBlock
from .tree_budget import MAX_BRANCH, TreeBudget


class TreeDraft:
    """One round's tree from a ModelDrafter, and what its cache must keep afterwards."""

    def __init__(self, drafter, history: list[int], params: SamplingParams, rng: np.random.Generator | None,
                 budget: TreeBudget, lookup=None):
        """`lookup`: a PromptLookupDrafter whose continuation is the tree's spine."""
        self.drafter, self.params, self.rng, self.budget = drafter, params, rng, budget
        self.history = history
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
        spine = lookup.lookup(history, budget.k) if lookup is not None else []
        spine = spine[: budget.lookup_feed(m, len(spine))]
        logits = self.block.forward(pending + spine, list(range(-1, m + len(spine) - 1)))
        self._grow(logits[m - 1:], spine)

    def _distributions(self, logits: mx.array, paths: list[list[int]]):
        """Per row (its tokens after the history in `paths`): (top probability, ranked
        (token, probability) candidates, q or None, the draft's top token)."""
        d, params = self.drafter, self.params
        sub = d.subset
        if params.greedy and not params.uses_context:
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            top = mx.argpartition(-lp, MAX_BRANCH - 1, axis=-1)[:, :MAX_BRANCH] if lp.shape[-1] > MAX_BRANCH \
                else mx.broadcast_to(mx.arange(lp.shape[-1])[None], lp.shape)
            probs = mx.exp(mx.take_along_axis(lp, top, axis=-1))
            ids = sub.ids[top] if sub is not None else top
            mx.eval(probs, ids)
            out = []
            for pr, tk in zip(probs.tolist(), ids.tolist()):
                ranked = sorted(zip(tk, pr), key=lambda c: -c[1])
                out.append((ranked[0][1], ranked, None, ranked[0][0]))
            return out
        if sub is not None:
            logits = sub.scatter(logits)
        contexts = [self.history + p for p in paths] if params.uses_context else None
        lp = process_logits(logits, params, contexts)
        q = np.array(mx.exp(lp).astype(mx.float32), dtype=np.float64)
        out = []
        for row in q:
            row = row / row.sum()
            best = int(np.argmax(row))
            if params.greedy:
                order = np.argsort(-row)[:MAX_BRANCH]
                out.append((float(row[order[0]]), [(int(t), float(row[t])) for t in order], None, best))
            else:
                top = -np.sort(-np.partition(row, -MAX_BRANCH)[-MAX_BRANCH:]) if row.size > MAX_BRANCH \
                    else np.sort(row)[::-1]
                out.append((float(top[0]), [(None, float(p)) for p in top if p > 0], row, best))
        return out

    def _check(self, dists):
        if any(c != c for c, *_ in dists):
            raise MlxspecError("the draft model produced NaN logits: its weights are corrupt or overflow in "
                               "this dtype; re-convert or re-download it, or use --no-draft")

    def _add_spine(self, spine: list[int], dists: list):
        """Add the lookup tokens the budget finds worth verifying, as a chain from the
        root; return the nodes whose draft distributions are known (the root and the
        spine nodes added), their values and distributions."""
        tree, budget = self.tree, self.budget
        nodes, values, rows = [-1], [1.0], [dists[0]]
        parent, v = -1, 1.0
        for i, tok in enumerate(spine):
            conf, _, _, best = dists[i]
            agree = best == tok
            a = budget.lookup_child(conf, agree)
            if not budget.include(v * a, i + 1):
                break
            # a token the draft would have proposed first counts as the draft's (its confidence bucket)
            parent = tree.add(tok, parent, None, conf if agree else None, a, conf if agree else None, lookup=True)
            v *= a
            self.fed[parent] = self._pending + i
            self.depth[parent] = i + 1
            nodes.append(parent)
            values.append(v)
            rows.append(dists[i + 1])
        return nodes, values, rows

    def _grow(self, logits: mx.array, spine: list[int]):
        budget, tree = self.budget, self.tree
        dists = self._distributions(logits, [spine[:i] for i in range(len(spine) + 1)])
        self._check(dists)
        nodes, values, dists = self._add_spine(spine, dists)
        while True:
            self.expanded.extend(nodes)
            cands = []  # (value, parent, rank, token or None, confidence, q, estimate, draft probability)
            for node, v, (conf, ranked, q, best) in zip(nodes, values, dists):
                if (self.drafter.p_min > 0 and conf < self.drafter.p_min) or self.depth[node] >= budget.k:
                    continue
                there = [tree.tokens[c] for c in tree.children(node)]  # a spine token
                if there:  # the draft's candidates besides it
                    ranked = [c for c in ranked if c[0] not in there] if ranked[0][0] is not None \
                        else ranked[1:] if best in there else ranked
                for r, (tok, p) in enumerate(ranked, len(there)):
                    a = budget.first_child(conf) if r == 0 else budget.sibling(p)
                    cands.append((v * a, node, r, tok, conf, q, a, p))
            cands.sort(key=lambda c: (-c[0], c[1], c[2]))
            added = []
            last_rank = {node: len(tree.children(node)) - 1 for node in nodes}
            for v, parent, r, tok, conf, q, a, p in cands:
                depth = self.depth[parent] + 1
                if last_rank[parent] != r - 1 or not budget.include(v, depth if r == 0 else None):
                    continue  # a sibling only after the ones ranked above it
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
            growable = sorted(((v, c) for v, c in added if self.depth[c] < budget.k), key=lambda c: -c[0])
            if added and not growable:
                budget.stop_reason = "cap"
            n = budget.expand([v for v, _ in growable], self.depth[growable[0][1]]) if growable else 0
            if not n:
                return
            chosen = [node for _, node in growable[:n]]
            parents = [self._block_index(tree.parents[c]) for c in chosen]
            logits = self.block.forward([tree.tokens[c] for c in chosen], parents)
            for i, c in enumerate(chosen):
                self.fed[c] = len(self.block) - len(chosen) + i
            nodes, values = chosen, [v for v, _ in growable[:n]]
            dists = self._distributions(logits, [[tree.tokens[j] for j in tree.path(c)] for c in chosen])
            self._check(dists)

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
