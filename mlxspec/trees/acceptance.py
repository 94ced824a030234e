"""The acceptance rule over a draft tree, exact for greedy and for sampling.

Greedy: walk down from the root along the target's argmax; the first position
whose argmax is not among the node's children gives the next token (at a leaf:
the bonus token).

Sampling -- recursive rejection sampling over siblings (SpecInfer, Miao et al.
2023; without replacement as in Jeon et al. 2024, "Recursive Speculative
Decoding"): at a node with target distribution r = p and children x_1..x_m,
where x_i was drawn from q_i (the draft's distribution with the earlier siblings
removed and renormalised, or one-hot for a lookup proposal), try them in order:
accept x_i with probability min(1, r(x_i)/q_i(x_i)); on rejection replace r by
norm(max(0, r - q_i)) and try the next; when all are rejected, sample from r.
Whatever the q_i are -- as long as x_i really is a draw from q_i -- the token
that comes out has distribution p.

A rejected x_i has zero mass in every later r, so the token that comes out names
the accepted child, if any: the rule is computed as the exact distribution o of
that token (`node_outcome`), one token is drawn from o, and the walk descends into
the child with that token.  This is the same random process as flipping the
acceptance coins one by one, and it makes the rule checkable by enumeration
(tests/test_tree_acceptance.py).
"""

from __future__ import annotations

import numpy as np

from .tree import DraftTree


def _proposal(q, token: int, size: int) -> np.ndarray:
    if q is not None:
        return q
    one_hot = np.zeros(size)
    one_hot[token] = 1.0
    return one_hot


def node_outcome(p: np.ndarray, tokens: list, qs: list) -> np.ndarray:
    """P(the token that comes out of a node = y), for target distribution p at the
    node and children `tokens` drawn (in this order) from `qs` (None: one-hot)."""
    r = np.asarray(p, dtype=np.float64)
    r = r / r.sum()
    out = np.zeros_like(r)
    reach = 1.0
    for x, q in zip(tokens, qs):
        q = _proposal(q, x, r.size)
        a = min(1.0, r[x] / q[x]) if q[x] > 0 else 0.0
        out[x] += reach * a
        reach *= 1.0 - a
        if reach <= 0.0:
            return out
        rest = np.maximum(r - q, 0.0)
        total = rest.sum()
        if total > 0:  # else r <= q everywhere, so a was 1 and reach is 0
            r = rest / total
    return out + reach * r


def walk_greedy(tree: DraftTree, best: list) -> tuple[list, int]:
    """`best[0]`: the target's argmax at the root; `best[1 + j]`: after node j.
    Returns (accepted nodes, root first; the next token)."""
    path, node = [], -1
    while True:
        t = best[node + 1]
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == t), None)
        if nxt is None:
            return path, t
        path.append(nxt)
        node = nxt


def walk_sample(tree: DraftTree, p: np.ndarray, rng: np.random.Generator) -> tuple[list, int]:
    """`p[0]`: the target's distribution at the root, `p[1 + j]`: after node j."""
    path, node = [], -1
    while True:
        kids = tree.children(node)
        o = node_outcome(p[node + 1], [tree.tokens[c] for c in kids], [tree.q[c] for c in kids])
        cdf = np.cumsum(o)
        y = int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), o.size - 1))
        nxt = next((c for c in kids if tree.tokens[c] == y), None)
        if nxt is None:
            return path, y
        path.append(nxt)
        node = nxt
