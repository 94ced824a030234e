"""How a greedy tree prices a node while it grows (tree_budget.TreeBudget, cut=True):
by what it adds to the selection the target will verify (`select`), so at the
position its value ranks, with what it pushes down.  The bug this guards: a sibling
worth 0.1 took a verify position that was free (3 positions cost what 2 do), and
the sure node below the first child was then priced at the next, dear position, so
the tree stopped where a chain went on (chat and creative trees were slower than
chains on a CPU with such a curve)."""

import pytest
from hypothesis import assume, given, settings, strategies as st

import test_greedy_equality as ge
import tiny_models
from mlxspec import tree_drafter
from mlxspec.cost_model import CostModel
from mlxspec.draft_length import PerToken
from mlxspec.drafters import ModelDrafter
from mlxspec.sampling import SamplingParams
from mlxspec.speculative import SpeculativeDecoder
from mlxspec.tree_budget import TreeBudget

# An AMD EPYC's calibration of the default pair (2026-12-04): 3 positions cost what 2 do.
VERIFY = [1.0, 1.08, 1.0, 1.19, 1.3, 1.41, 1.57, 1.74, 1.94, 2.14]


class Policy:
    """A per-token policy's numbers, fixed: every draft kept with probability `a`."""

    forced = False

    def __init__(self, a: float, rate: float | None, verify=VERIFY, draft_step: float = 0.26):
        self.a, self._rate = a, rate
        self.cost = CostModel(draft_step, list(verify), draft_widths=[1.0, 1.17, 1.33, 1.43])

    def rate(self):
        return self._rate

    def mean_acceptance(self, lookup=False, optimistic=False):
        return self.a

    def acceptance(self, confidence):
        return self.a

    def sibling_scale(self):
        return 1.0


def grow_past_a_sibling(cut: bool, sibling: bool = True) -> int:
    """The root fed, its first child (0.9) and a sibling (0.1) in: is the first child
    fed for its own child (the tree two deep: horizon 1)?"""
    b = TreeBudget(Policy(0.65, rate=1.5), 2, cut=cut)
    assert b.expand([1.0], 0) == 1
    assert b.include(0.9, 1)
    values = [0.9]
    if sibling:
        assert b.include(0.1)  # free: the pass over 3 positions costs what 2 do
        values.append(0.1)
    return b.expand(values, 1)


def test_a_sure_node_under_a_free_sibling_is_priced_where_it_ranks():
    """The first child's child (0.9 * 0.65 = 0.585) for a draft step (0.26): a chain
    verifies it at the free third position, and so does a cut tree, which pushes the
    sibling to the fourth (1.19) and then drops it; priced at the fourth position
    itself (0.26 + 0.19 for 0.585, against a bar of 1.5) it was not grown."""
    assert grow_past_a_sibling(cut=False, sibling=False) == 1  # the chain
    assert grow_past_a_sibling(cut=True) == 1
    assert grow_past_a_sibling(cut=False) == 0  # as sampled trees (verified whole) still price it


def test_the_pushed_down_sibling_is_then_cut():
    b = TreeBudget(Policy(0.65, rate=1.5), 2, cut=True)
    b.expand([1.0], 0)
    for v in (0.9, 0.1):
        b.include(v)
    b.expand([0.9, 0.1], 1)
    assert b.include(0.585, 2)
    # E = 2.485 for T = 0.52 + 1.0, against 2.585 for 0.52 + 1.19: 0.1 more token for 0.19 steps
    assert b.select(sorted(b.values, reverse=True)) == 2


def test_a_better_node_takes_a_free_position_from_a_worse_one():
    """A node joins where the selection gains: where the positions it could take are
    dear, a better node than the last one verified still gains (that one is then
    dropped), and priced at the dear position it does not."""
    steep = [1.0, 1.0, 1.0, 2.0, 3.0]
    for cut in (True, False):
        b = TreeBudget(Policy(0.9, rate=1.0, verify=steep), 1, cut=cut)
        assert b.include(0.9) and b.include(0.5)  # positions 2 and 3: free
        assert not b.include(0.4)  # the fourth costs 1.0 plain step
        assert b.include(0.6) == cut
    b = TreeBudget(Policy(0.9, rate=1.0, verify=steep), 1, cut=True)
    for v in (0.9, 0.5, 0.6):
        b.include(v)
    assert b.select([0.9, 0.6, 0.5]) == 2  # 0.5 is dropped


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=0, max_size=12, unique=True), st.floats(0.01, 1.0),
       st.lists(st.floats(0.0, 0.6), min_size=4, max_size=16), st.floats(0.0, 2.0), st.floats(0.1, 1.0))
def test_a_lone_node_joins_exactly_when_the_selection_keeps_it(values, v, steps, draft, rate_share):
    """Judged alone (no deeper nodes), a node joins a cut tree iff `select`, over the
    tree with it, verifies it -- under a long-run rate below the round's own.  (At an
    exact tie, where verifying it or not gains the same, either is right.)"""
    assume(v not in values)
    verify, c = [], 1.0
    for s in steps:
        verify.append(c)
        c += s
    probe = TreeBudget(Policy(0.5, None, verify), 8, cut=True)
    probe.draft = draft
    round_rate = probe._bar(values, draft)
    b = TreeBudget(Policy(0.5, rate_share * round_rate, verify), 8, max_nodes=64, cut=True)
    b.draft, b.values = draft, sorted(values, reverse=True)
    both = sorted(values + [v], reverse=True)
    kept, at = b.select(both), both.index(v)
    rate, e, objective = b.rate, 1.0, []
    for m in range(len(both) + 1):
        e += both[m - 1] if m else 0.0
        objective.append(e - rate * (draft + b.cost.verify_width(m + 1)))
    assume(abs(max(objective[at + 1:]) - max(objective[:at + 1])) > 1e-9)
    assert b.include(v) == (at < kept)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_trees_are_cut_and_sampled_ones_are_not(arch, monkeypatch):
    """The loop prices greedy trees for the cut (and they stay plain's output), sampled
    ones at the positions they take (every node of theirs is verified)."""
    target = tiny_models.build(tiny_models.config_for(arch), seed=0)
    draft = tiny_models.perturbed(target, tiny_models.config_for(arch), noise=0.03, seed=3)
    cut = []
    commit = tree_drafter.TreeDraft.commit

    def seen(self, path):
        cut.append((self.params.greedy, self.budget.cut))
        return commit(self, path)

    monkeypatch.setattr(tree_drafter.TreeDraft, "commit", seen)
    for start in ([7, 19, 200, 31], [40, 41, 42]):
        dec = SpeculativeDecoder(target, ModelDrafter(draft), PerToken(CostModel(0.26, VERIFY), 8), tree=True)
        got = [t for t, _ in dec.generate(list(start), max_tokens=24)]
        ge.assert_same_or_near_tie(target, start, ge.plain(target, start), got)
    dec = SpeculativeDecoder(target, ModelDrafter(draft), PerToken(CostModel(0.26, VERIFY), 8), tree=True)
    list(dec.generate([7, 19, 200, 31], SamplingParams(temp=0.7, seed=1), max_tokens=16))
    assert {g for g, _ in cut} == {True, False}
    assert all(g == c for g, c in cut)
