"""The tree acceptance rule, checked exactly by enumeration on small vocabularies:
averaged over every way the siblings can be drawn, the token that comes out of a
node has exactly the target's distribution p -- for random p and q, zeros in q,
siblings drawn with replacement (duplicates) or without, and one-hot (prompt
lookup) branches.  A rule that forgets to renormalise the siblings' proposals
fails the same check."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mlxspec.trees.tree import DraftTree
from mlxspec.trees.acceptance import node_outcome, walk_greedy, walk_sample


def dist(rng, v, zeros):
    x = rng.random(v) ** 3
    if zeros:
        x[rng.choice(v, size=min(zeros, v - 1), replace=False)] = 0.0
    return x / x.sum()


def without(q, taken):
    q = q.copy()
    q[list(taken)] = 0.0
    s = q.sum()
    return q / s if s > 0 else None


def outcome_without_replacement(p, q, m, first=(), renormalise=True):
    """Exact E[o] when `first` one-hot branches come first and then up to m siblings
    are drawn from q without replacement (fewer when q runs out of mass)."""
    total = np.zeros_like(p)
    fixed_tokens, fixed_qs = list(first), [None] * len(first)

    def rec(tokens, qs, prob, taken, left):
        nonlocal total
        qi = without(q, taken)
        if left == 0 or qi is None:
            total += prob * node_outcome(p, tokens, qs)
            return
        for x in np.flatnonzero(qi > 0):
            rec(tokens + [int(x)], qs + [qi if renormalise else q], prob * qi[x], taken | {int(x)}, left - 1)

    rec(fixed_tokens, fixed_qs, 1.0, set(first), m)
    return total


def outcome_with_replacement(p, q, m):
    total = np.zeros_like(p)
    support = np.flatnonzero(q > 0)
    for xs in itertools.product(support, repeat=m):
        prob = np.prod([q[x] for x in xs])
        total += prob * node_outcome(p, [int(x) for x in xs], [q] * m)
    return total


cases = dict(seed=st.integers(0, 10**6), v=st.integers(2, 6), m=st.integers(1, 3),
             zp=st.integers(0, 3), zq=st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(**cases)
def test_siblings_without_replacement_give_p(seed, v, m, zp, zq):
    rng = np.random.default_rng(seed)
    p, q = dist(rng, v, zp), dist(rng, v, zq)
    np.testing.assert_allclose(outcome_without_replacement(p, q, m), p, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(**cases)
def test_siblings_with_replacement_give_p(seed, v, m, zp, zq):
    rng = np.random.default_rng(seed)
    p, q = dist(rng, v, zp), dist(rng, v, zq)
    np.testing.assert_allclose(outcome_with_replacement(p, q, m), p, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(n_lookup=st.integers(1, 2), **cases)
def test_lookup_branches_then_draft_siblings_give_p(seed, v, m, zp, zq, n_lookup):
    rng = np.random.default_rng(seed)
    p, q = dist(rng, v, zp), dist(rng, v, zq)
    first = rng.choice(v, size=min(n_lookup, v), replace=False).tolist()
    np.testing.assert_allclose(outcome_without_replacement(p, q, m, first=first), p, atol=1e-12)


def test_one_hot_chain_matches_the_chain_rule():
    p = np.array([0.5, 0.3, 0.2])
    o = node_outcome(p, [1], [None])
    np.testing.assert_allclose(o, [0.5 * 0.7 / 0.7, 0.3, 0.2 * 0.7 / 0.7])


def test_broken_rule_fails_the_same_check():
    """The control: siblings drawn without replacement but verified against the
    un-renormalised q.  Found by the same enumeration on random cases."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(50):
        v = int(rng.integers(3, 6))
        p, q = dist(rng, v, 0), dist(rng, v, 0)
        worst = max(worst, np.abs(outcome_without_replacement(p, q, 2, renormalise=False) - p).max())
    assert worst > 1e-2


def test_walks():
    tree = DraftTree()
    a = tree.add(3)
    b = tree.add(4)  # a sibling of a
    c = tree.add(5, b)
    # greedy: the target's argmax picks b, then c, then its bonus token 7
    best = [4, 0, 5, 7]
    assert walk_greedy(tree, best) == ([b, c], 7)
    assert walk_greedy(tree, [9, 0, 0, 0]) == ([], 9)
    # sampling with point-mass targets follows them, whatever the proposals
    v = 10
    p = np.zeros((4, v))
    p[0, 4] = p[2, 5] = p[3, 7] = 1.0
    p[1, 1] = 1.0
    q = np.full(v, 1.0 / v)
    tree.q = [q, without(q, {3}), q]
    assert walk_sample(tree, p, np.random.default_rng(0)) == ([b, c], 7)
