"""The last step of growing a greedy draft tree (tree_drafter.TreeDraft._select,
tree_budget.TreeBudget.select): the target verifies the tree's best nodes by value,
as many as pay for their verify positions; the rest are dropped before the pass.
A node can be grown that does not pay alone -- it was taken for the deeper nodes
it was expected to lead to, which the draft then did not propose -- and on a CPU,
where a wider pass costs more, verifying it is a loss."""

import pytest

import drafter_models
import test_greedy_equality as ge
import tiny_models
from mlxspec.trees import drafter as tree_drafter
from mlxspec.costs.cost_model import CostModel
from mlxspec.costs.exploration import Ledger
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.trees.tree import DraftTree
from mlxspec.trees.budget import TreeBudget


def budget(rate, draft=0.5):
    pol = PerToken(CostModel(0.25, [1.0, 1.1, 1.2, 1.8, 2.4]), 8)
    pol.rate = lambda: rate
    b = TreeBudget(pol, 8)
    b.draft = draft
    return b


def test_select_keeps_the_count_that_pays_at_the_bar():
    """Values 0.9, 0.6, 0.2 after 0.5 plain steps of drafting, over a pass costing 1,
    1.1, 1.2, 1.8 for 1-4 positions: E = 1, 1.9, 2.5, 2.7 for T = 1.5, 1.6, 1.7, 2.3.
    The best round rate is at two nodes (2.5 / 1.7); the third adds 0.2 tokens for 0.6
    plain steps, which pays only against a long-run rate below 1/3."""
    values = [0.9, 0.6, 0.2]
    assert budget(None).select(values) == 2  # the round's own E/T
    assert budget(1.0).select(values) == 2  # a long-run rate below the round's best
    assert budget(0.3).select(values) == 3  # a rate so low that 0.2 / 0.6 beats it
    assert budget(None, draft=0.0).select([0.05]) == 0  # a single node not worth its position
    assert budget(None).select([]) == 0


def test_only_keeps_the_nodes_under_their_parents_and_maps_them():
    t = DraftTree()
    for tok, parent, est in ((10, -1, 0.9), (11, 0, 0.5), (12, -1, 0.2), (13, 1, 0.5), (14, 2, 1.0)):
        t.add(tok, parent, estimate=est)
    assert t.values() == pytest.approx([0.9, 0.45, 0.2, 0.225, 0.2])
    kept, new = t.only([3, 0, 1])
    assert kept.tokens == [10, 11, 13] and kept.parents == [-1, 0, 1] and kept.estimate == [0.9, 0.5, 0.5]
    assert new == {-1: -1, 0: 0, 1: 1, 3: 2}


# The default pair's costs as calibrated on this CPU (2026-12-04): flat from 3 to 4 positions,
# then dearer by the position -- the lookahead grows nodes through the flat part.
VERIFY = [1.0, 1.11, 1.17, 1.18, 1.22, 1.25, 1.31, 1.36, 1.48, 1.6, 1.71, 1.83, 1.93, 2.04, 2.14, 2.24, 2.5]
DRAFT_WIDTHS = [1.0, 1.14, 1.32, 1.42, 1.54, 1.65, 1.81, 1.97]


def measured(max_k=8):
    return PerToken(CostModel(0.22, VERIFY, draft_widths=DRAFT_WIDTHS), max_k)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_verified_tree_has_no_node_that_does_not_pay(arch, monkeypatch):
    """Every greedy round's verified tree is one the budget would keep whole (its
    values, best first, select all of it), it is ancestor-closed with the draft's
    bookkeeping (fed block indices, depths) moved along, and the output is plain's."""
    target = tiny_models.build(tiny_models.config_for(arch), seed=0)
    draft = tiny_models.perturbed(target, tiny_models.config_for(arch), noise=0.03, seed=3)
    seen = []
    commit = tree_drafter.TreeDraft.commit

    def check(self, path):
        tree, values = self.tree, self.tree.values()
        for i in range(len(tree)):
            assert tree.parents[i] < i and self.depth[i] == tree.depth(i)
        for node, at in self.fed.items():  # the draft block fed this node's token, under its parent's
            assert self.block.tokens[at] == tree.tokens[node]
            p = tree.parents[node]
            assert self.block.parents[at] == (self._pending - 1 if p < 0 else self.fed[p])
        assert self.budget.select(sorted(values, reverse=True)) == len(tree)
        seen.append(len(tree))
        return commit(self, path)

    monkeypatch.setattr(tree_drafter.TreeDraft, "commit", check)
    # the tiny draft is seldom confident: let every try on hope go (the exploration ledger is not checked here)
    monkeypatch.setattr(Ledger, "allows", lambda self, policy: True)
    for start in ([7, 19, 200, 31], [40, 41, 42], [5, 9, 100, 3, 3]):
        dec = SpeculativeDecoder(target, ModelDrafter(draft), measured(), tree=True)
        got = [t for t, _ in dec.generate(list(start), max_tokens=24)]
        ge.assert_same_or_near_tie(target, start, ge.plain(target, start), got)
    assert seen and max(seen) >= 2, "trees were grown and verified"
