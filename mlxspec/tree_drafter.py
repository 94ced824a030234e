"""Growing a draft tree with the draft model, level by level (EAGLE-2's dynamic
trees, with the size rule of tree_budget.py).

The draft feeds what it lacks of the history; its last row is the root's
distribution.  Each level: the nodes chosen for expansion are fed to the draft
together, as one tree block (tree_attention.py: one batched forward, each node
seeing only its ancestors); each gets up to MAX_BRANCH children, ranked by
estimated value; the tree takes the candidates worth verifying and the best of
those are expanded next.  Greedy: children are the draft's top tokens.
Sampling: children are drawn from the draft's processed distribution q without
replacement (each keeps the renormalised q it was drawn from, for the
acceptance rule), and a child is drawn only after deciding to add it -- the
decision looks at q's sorted probabilities, never at the drawn token, which
would bias the proposals.

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
        self.drafter, self.params, self.rng, self.budget = drafter, params, rng, budget
        self.history = history
        self.tree = DraftTree()
        self.fed: dict[int, int] = {}  # tree node -> draft block index
        self.expanded: list[int] = []  # tree nodes whose children were proposed (-1: the root)
        state = drafter.state
        pending = state.sync(history)
        self.block = TreeBlock(state)
        self._pending = len(pending)
        if not budget.expand([1.0], 0):
            return
        logits = self.block.forward(pending, list(range(-1, len(pending) - 1)))
        self._grow(logits[-1:], [-1], [1.0])
        if lookup is not None:
            self._add_lookup(lookup.lookup(history, budget.k))

    def _add_lookup(self, tokens: list[int]):
        """Prompt lookup's continuation as a branch: it follows the tree where the
        draft proposed the same tokens and goes on as one-hot proposals (q = None)
        where it did not, while the budget finds each node worth its verify cost."""
        tree, budget = self.tree, self.budget
        node, v = -1, 1.0
        for depth, tok in enumerate(tokens, 1):
            same = next((c for c in tree.children(node) if tree.tokens[c] == tok), None)
            if same is not None:
                node, v = same, v * (tree.estimate[same] or 0.0)
                continue
            a = budget.first_child(None)
            if depth > budget.k or not budget.include(v * a):
                return
            node, v = tree.add(tok, node, None, None, a), v * a

    def _context(self, node: int) -> list[int]:
        return self.history + [self.tree.tokens[j] for j in self.tree.path(node)] if node >= 0 else self.history

    def _distributions(self, logits: mx.array, nodes: list[int]):
        """Per node: (top probability, ranked (token, probability) candidates, q or None)."""
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
                out.append((ranked[0][1], ranked, None))
            return out
        if sub is not None:
            logits = sub.scatter(logits)
        contexts = [self._context(n) for n in nodes] if params.uses_context else None
        lp = process_logits(logits, params, contexts)
        q = np.array(mx.exp(lp).astype(mx.float32), dtype=np.float64)
        out = []
        for row in q:
            row = row / row.sum()
            if params.greedy:
                order = np.argsort(-row)[:MAX_BRANCH]
                out.append((float(row[order[0]]), [(int(t), float(row[t])) for t in order], None))
            else:
                top = -np.sort(-np.partition(row, -MAX_BRANCH)[-MAX_BRANCH:]) if row.size > MAX_BRANCH \
                    else np.sort(row)[::-1]
                out.append((float(top[0]), [(None, float(p)) for p in top if p > 0], row))
        return out

    def _grow(self, logits: mx.array, nodes: list[int], values: list[float]):
        depth = 0
        budget, tree = self.budget, self.tree
        while True:
            dists = self._distributions(logits, nodes)
            if any(c != c for c, _, _ in dists):
                raise MlxspecError("the draft model produced NaN logits: its weights are corrupt or overflow in "
                                   "this dtype; re-convert or re-download it, or use --no-draft")
            self.expanded.extend(nodes)
            cands = []  # (value, parent, rank, token or None, confidence, q, estimate, draft probability)
            for node, v, (conf, ranked, q) in zip(nodes, values, dists):
                if self.drafter.p_min > 0 and conf < self.drafter.p_min:
                    continue
                for r, (tok, p) in enumerate(ranked):
                    a = budget.first_child(conf) if r == 0 else budget.sibling(p)
                    cands.append((v * a, node, r, tok, conf, q, a, p))
            cands.sort(key=lambda c: (-c[0], c[1], c[2]))
            added = []
            last_rank: dict[int, int] = {}
            for v, parent, r, tok, conf, q, a, p in cands:
                if last_rank.get(parent, -1) != r - 1 or not budget.include(v, depth + 1 if r == 0 else None):
                    continue  # a sibling only after the ones ranked above it
                last_rank[parent] = r
                q_node = None
                if q is not None:  # sampling: draw now, from q without the earlier siblings
                    q_node = self._remaining(parent, q)
                    if q_node is None:
                        continue
                    tok = int(self.rng.choice(q_node.size, p=q_node))
                added.append((v, tree.add(tok, parent, q_node, conf, a, p)))
            depth += 1
            added.sort(key=lambda c: -c[0])
            n = budget.expand([v for v, _ in added], depth) if added else 0
            if not n:
                return
            chosen = [node for _, node in added[:n]]
            parents = [self._block_index(tree.parents[c]) for c in chosen]
            logits = self.block.forward([tree.tokens[c] for c in chosen], parents)
            for c in chosen:
                self.fed[c] = len(self.block) - len(chosen) + chosen.index(c)
            nodes, values = chosen, [v for v, _ in added[:n]]

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
