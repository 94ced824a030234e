"""Prompt lookup's continuation as the spine of a draft tree (trees/drafter.py): the
draft scores the whole spine in its first forward, the output stays plain's
(greedy) and the target's exact distribution (sampling, chi-square with a broken
control), and the budget's two rules for it behave as documented."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drafter_models
import test_greedy_equality as ge
import test_sequence_distribution as sd
import tiny_models
from mlxspec.trees import drafter as tree_drafter
from mlxspec.costs.cost_model import CostModel, assumed
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from mlxspec.trees.attention import TreeBlock
from mlxspec.trees.budget import TreeBudget
from stats_util import chi_square

SAMPLES = 1000  # the broken control fails at p ~ 1e-14 with these (threshold 1e-6); the sound rule passes at p = 0.2


def wide(max_k=8):
    return PerToken(assumed(0.05, slope=0.0, width=40), max_k)


def draft_forwards(monkeypatch, state) -> list:
    """Widths of the forwards `state` (a draft's ModelState) makes through tree blocks
    (a tree call, or the causal call of a block that is one chain)."""
    widths = []
    call, causal = TreeBlock._call, TreeBlock._causal

    def counted(self, x, *args):
        if self.state is state:
            widths.append(x.size)
        return (call if args else causal)(self, x, *args)

    monkeypatch.setattr(TreeBlock, "_call", counted)
    monkeypatch.setattr(TreeBlock, "_causal", counted)
    return widths


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_spine_goes_in_with_the_drafts_first_forward(arch, monkeypatch):
    """The lookup continuation is fed with the pending tokens, in one draft forward:
    its tokens are the tree's first chain, fed (the next round keeps the accepted
    ones without feeding them again), each carrying the draft's opinion of it (its
    confidence where the draft's top token is the same, None where it is not)."""
    from mlxspec.drafting.drafters import PromptLookupDrafter
    from mlxspec.core.sampling import SamplingParams

    target = drafter_models.lookup_target(arch)
    draft = tiny_models.perturbed(target, tiny_models.config_for(arch), noise=0.03, seed=3)
    history = drafter_models.grounded_prompt(target, [5, 9, 100], n=20)
    lookup = PromptLookupDrafter()
    spine = lookup.lookup(history, 8)
    assert len(spine) == 8
    drafter = ModelDrafter(draft, p_min=1.01)  # no draft candidates: the tree is the spine alone
    drafter.prefill(history[:-3])  # the cache lacks the last 4 tokens
    widths = draft_forwards(monkeypatch, drafter.state)
    d = tree_drafter.TreeDraft(drafter, history, SamplingParams(), None, TreeBudget(wide(8), 8), lookup)
    assert widths == [4 + 8]  # the pending tokens and the spine, one forward
    tree = d.tree
    assert tree.tokens == spine and tree.parents == list(range(-1, 7)) and all(tree.lookup)
    assert [d.fed[j] for j in range(8)] == list(range(4, 12))
    best = np.argmax(np.array(draft(__import__("mlx.core").core.array(history + spine)[None])[0]), axis=-1)
    for j, tok in enumerate(spine):  # the draft's top token after history + spine[:j]
        agree = int(best[len(history) - 1 + j]) == tok
        assert (tree.confidence[j] is not None) == agree
    assert any(c is not None for c in tree.confidence) and any(c is None for c in tree.confidence)


def test_lookup_continues_under_the_best_node_of_a_level(monkeypatch):
    """Where lookup has nothing after the history but finds a match after a drafted
    node, its continuation goes in with that level's forward, under the node."""
    target = drafter_models.lookup_target("qwen2")
    draft = tiny_models.perturbed(target, tiny_models.config_for("qwen2"), noise=0.03, seed=3)
    trees = []
    commit = tree_drafter.TreeDraft.commit
    monkeypatch.setattr(tree_drafter.TreeDraft, "commit", lambda self, path: (trees.append(self.tree), commit(self, path))[1])
    for start in ([7, 19, 200, 31], [40, 41, 42, 43, 44], [5, 9, 100], [11, 250, 3, 77, 8]):
        prompt = drafter_models.grounded_prompt(target, start, n=20)
        got = [t for t, _ in SpeculativeDecoder(target, ModelDrafter(draft), wide(8), tree=True).generate(list(prompt),
                                                                                              max_tokens=20)]
        ge.assert_same_or_near_tie(target, prompt, [t for t, _ in SpeculativeDecoder(target).generate(
            list(prompt), max_tokens=20)], got)
    under_drafted = [j for t in trees for j in range(len(t)) if t.lookup[j] and t.parents[j] >= 0
                     and not t.lookup[t.parents[j]]]  # lookup tokens under a node the draft proposed
    assert under_drafted


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(5, 299), min_size=2, max_size=8), noise=st.sampled_from([0.03, 0.5]),
       max_k=st.integers(1, 10))
def test_spine_trees_greedy_equal_plain(arch, prompt, noise, max_k):
    """Grounded prompts (lookup right about half the time) and drafts that mostly
    agree (0.03) or often disagree (0.5) with the target: the spine's tokens where the
    draft proposes others, and the draft's siblings beside them, never change the output."""
    target = drafter_models.lookup_target(arch)
    draft = tiny_models.perturbed(target, tiny_models.config_for(arch), noise=noise, seed=3)
    prompt = drafter_models.grounded_prompt(target, prompt)
    dec = SpeculativeDecoder(target, ModelDrafter(draft), wide(max_k), tree=True)
    h = list(prompt)
    got = [t for t, _ in dec.generate(h, max_tokens=ge.MAX_TOKENS)]
    ge.assert_same_or_near_tie(target, prompt, ge.plain(target, prompt), got)
    assert h == list(prompt) + got


@pytest.fixture(scope="module")
def lookup_pair():
    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    target = drafter_models.lookup_target("llama", vocab_size=sd.V, hidden=32, ffn=64)
    return target, tiny_models.build(cfg, seed=4, scale=1.5)


def spine_samples(lookup_pair, monkeypatch):
    target, draft = lookup_pair
    prompt = drafter_models.grounded_prompt(target, [1, 5, 2], n=4)
    taken = []
    record = GenerationStats.record_tree
    monkeypatch.setattr(GenerationStats, "record_tree", lambda self, *a: (taken.append(a[4]), record(self, *a))[1])
    probs = sd.exact_sequence_probs(target, sd.PARAMS, prompt=prompt)
    counts, _ = sd.sample_sequences(target, draft, sd.PARAMS, k=wide(3), prompt=prompt, samples=SAMPLES)
    return chi_square(counts, probs, SAMPLES), sum(taken)


def test_spine_and_sampled_siblings_match_the_target_distribution(lookup_pair, monkeypatch):
    """One-hot spine tokens first, the draft's children drawn from q without them:
    3-token samples follow the target's exact sequence distribution."""
    (stat, df, pval), taken = spine_samples(lookup_pair, monkeypatch)
    print(f"chi2={stat:.1f} df={df} p={pval:.3g} lookup taken={taken}")
    assert taken > SAMPLES // 10, taken
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


def test_chi_square_fails_when_siblings_keep_the_spine_token_in_q(lookup_pair, monkeypatch):
    """The control: the draft's children are drawn from q without the spine token
    (as they must be) but recorded with the q that still holds it, so the acceptance
    rule divides by the wrong q; the same test catches it."""
    from mlxspec.trees.tree import DraftTree

    remaining, add = tree_drafter.TreeDraft._remaining, DraftTree.add
    drawn_from = {}

    def remember(self, parent, q):
        out = remaining(self, parent, q)
        if out is not None:
            drawn_from[id(out)] = q
        return out

    def misreport(self, token, parent=-1, q=None, *args, **kwargs):
        return add(self, token, parent, drawn_from.get(id(q), q), *args, **kwargs)

    monkeypatch.setattr(tree_drafter.TreeDraft, "_remaining", remember)
    monkeypatch.setattr(DraftTree, "add", misreport)
    (stat, df, pval), _ = spine_samples(lookup_pair, monkeypatch)
    print(f"misreported q beside a spine token: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval < 1e-6, f"a misreported q beside the spine went unnoticed: p={pval:.2e}"


def policy_with(lookup_acceptance: float, cost: CostModel) -> PerToken:
    pol = PerToken(cost, 12)
    cal = pol.calibration
    b = cal.bucket(None)
    cal.kept[b], cal.seen[b] = lookup_acceptance * 10, 10.0
    return pol


def test_lookup_feed_follows_the_lookups_acceptance_and_the_draft_width():
    flat = assumed(0.3, slope=0.0, width=20)
    steep = assumed(0.3, slope=0.2, width=20)
    assert TreeBudget(policy_with(0.9, flat), 12).lookup_feed(1, 10) == 10  # width free: feed it all
    # each token adds 0.2 of a draft step: fed while the chance that all of them hold is >= 0.2
    assert TreeBudget(policy_with(0.7, steep), 12).lookup_feed(1, 10) == 4  # 0.7^4 = 0.24, 0.7^5 = 0.17
    assert TreeBudget(policy_with(0.5, steep), 12).lookup_feed(1, 10) == 2
    assert TreeBudget(policy_with(0.9, flat), 4).lookup_feed(1, 10) == 4  # never deeper than the round's cap
    b = TreeBudget(policy_with(0.9, steep), 12)
    t = b.t
    n = b.lookup_feed(2, 10)
    assert b.t == pytest.approx(t + 0.3 * (steep.verify_width(2 + n) - steep.verify_width(2)))  # the width is paid
    # the draft's own width curve, where calibrated, prices it (not the target's)
    own = CostModel(0.3, list(flat.verify), draft_widths=[1.0 + 0.2 * w for w in range(20)])
    assert TreeBudget(policy_with(0.7, own), 12).lookup_feed(1, 10) == 4
    b = TreeBudget(policy_with(0.9, own), 12)
    n = b.lookup_feed(2, 10)
    assert b.t == pytest.approx(1.0 + 0.3 * 0.2 * n)


def test_a_tree_level_is_priced_by_the_drafts_width_curve():
    """Nodes fed together share a draft forward, which costs what the draft's curve says
    for that width: a steep draft curve feeds fewer of them than a flat verify curve
    would suggest."""
    flat = assumed(0.3, slope=0.0, width=20)
    steep_draft = CostModel(0.3, list(flat.verify), draft_widths=[1.0 + w for w in range(20)])
    values = [0.9, 0.3, 0.2, 0.1]
    assert TreeBudget(policy_with(0.6, flat), 12).expand(values, 1) == 4
    assert TreeBudget(policy_with(0.6, steep_draft), 12).expand(values, 1) < 4


def test_a_spine_token_the_draft_doubts_is_estimated_below_one_it_agrees_with():
    b = TreeBudget(policy_with(0.6, assumed(0.3)), 12)
    agree, doubt = b.lookup_child(0.9, True), b.lookup_child(0.9, False)
    assert agree == pytest.approx(max(0.6, b.first_child(0.9)))
    assert doubt == pytest.approx(0.6 * 0.1)
    assert b.lookup_child(0.3, False) > doubt  # a split draft doubts it less
