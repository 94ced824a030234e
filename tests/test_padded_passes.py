"""Passes padded to a wider width where that costs less (cost_model.CostModel.pad_width).

On this machine's OpenBLAS a 16-row product is cheaper than a 5- to 15-row one, so
a verify pass (and a tree-drafting forward) over w positions runs padded to the
cheapest width at or above w.  Padding must change nothing but the cost: the real
positions' logits are those of the unpadded pass, the caches afterwards equal a
fresh prefill of the kept tokens, and greedy output equals plain decoding."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import test_cache_rollback as cr
import test_greedy_equality as ge
import test_sequence_distribution as sd
from mlxspec.costs import calibration as calibration_cache, cost_model
from mlxspec.core.cache import ModelState
from mlxspec.costs.cost_model import CostModel, assumed, from_times
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.trees.attention import TreeBlock
from stats_util import chi_square
from test_tree_attention import chain_logits, path_to, tree_case

# relative costs measured for the default target on this machine's OpenBLAS (rounded)
MEASURED = {1: 1.0, 2: 1.21, 3: 1.45, 4: 1.66, 6: 1.77, 8: 1.8, 12: 2.67, 16: 1.57, 17: 2.5, 32: 2.36}
# the same shape, flatter: tiny test models draft with little confidence, so rounds need cheap passes
FLAT = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 6: 1.2, 8: 1.3, 12: 1.5, 16: 1.12, 17: 1.6, 32: 1.55}
SAMPLES = 300  # the control fails at p ~ 4e-23 with these (threshold 1e-6); the sound rule passes at p = 0.55


def dipped(draft_step=0.35, table=MEASURED) -> CostModel:
    times = {w: [0.5 * c] * 3 for w, c in table.items()}
    times["draft"] = [0.5 * draft_step] * 3
    return from_times(times)


def test_a_wider_pass_that_costs_less_is_used():
    cm = dipped()
    assert [cm.pad_width(w) for w in (1, 2, 3)] == [1, 2, 3]  # nothing wider is cheaper
    assert all(cm.pad_width(w) == 16 for w in range(4, 17))
    assert cm.verify_width(5) == cm.verify_width(16) == 1.57
    assert cm.pad_width(17) == 32 and cm.verify_width(20) == 2.36
    assert cm.pad_width(33) == 33  # beyond the table: as it is
    costs = [cm.verify_width(w) for w in range(1, 45)]
    assert all(b >= a for a, b in zip(costs, costs[1:]))  # more positions never cost less
    assert "5: 1.57 (as 16)" in cm.describe()


def test_no_padding_where_wider_never_costs_less_or_saves_only_noise():
    cm = assumed(0.3, slope=0.1, width=32)
    assert all(cm.pad_width(w) == w for w in range(1, 40))
    assert cost_model.PAD_MIN_SAVING > 0.02
    noise = CostModel(0.3, [1.0, 1.2, 1.4, 1.6, 1.58, 1.62], 0.1, "measured")  # 0.02 cheaper at 5
    assert noise.pad_width(4) == 4 and noise.verify_width(4) == 1.58  # priced within the margin of what runs


def test_a_cached_calibration_keeps_its_dip(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    calibration_cache.save("k", dipped())
    cm = calibration_cache.load_cached("k")
    assert cm is not None and cm.source == "cached" and cm.pad_width(5) == 16


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), prefix_len=st.integers(1, 9), n=st.integers(1, 10), levels=st.integers(1, 3))
def test_padded_tree_block_gives_the_unpadded_logits_and_commits_exactly(arch, seed, prefix_len, n, levels):
    model, rng, prefix, tokens, parents, state, block, cuts = tree_case(arch, seed, prefix_len, n, levels)
    rows, index = [], []  # index: block index of tree node i (pads take indices too)
    for a, b in zip(cuts, cuts[1:]):
        base = len(block)
        index += list(range(base, base + b - a))
        level_parents = [index[p] if p >= 0 else -1 for p in parents[a:b]]
        width = b - a + int(rng.integers(0, 7))
        before = state.positions
        out = block.forward(tokens[a:b], level_parents, width)
        assert out.shape[0] == b - a and state.positions - before == width and len(block) == base + width
        rows.extend(np.array(out))
    for i in range(n):
        ref = chain_logits(model, prefix + [tokens[j] for j in path_to(parents, i)])[-1]
        np.testing.assert_allclose(rows[i], np.array(ref), atol=2e-4, rtol=1e-4)
    path = path_to(parents, int(rng.integers(0, n)))
    block.commit([index[j] for j in path])
    kept = prefix + [tokens[j] for j in path]
    cr.assert_cache_is_fresh_prefill(state, kept + [0])


@settings(max_examples=15, deadline=None)
@given(prompt=st.lists(st.integers(5, 299), min_size=1, max_size=10), drafted=st.lists(st.integers(5, 299), min_size=1,
       max_size=6), extra=st.integers(1, 8), keep=st.integers(0, 6), nxt=st.integers(5, 299))
def test_padded_chain_forward_gives_the_unpadded_logits_and_rolls_back_exactly(prompt, drafted, extra, keep, nxt):
    padded, plain = ModelState(cr.TARGET), ModelState(cr.TARGET)
    for s in (padded, plain):
        s.forward(prompt)
    a = padded.forward(drafted, len(drafted) + extra)
    b = plain.forward(drafted)
    assert a.shape == b.shape and padded.positions - plain.positions == extra
    np.testing.assert_allclose(np.array(a), np.array(b), atol=2e-4, rtol=1e-4)
    history = prompt + drafted[: min(keep, len(drafted))] + [nxt]
    padded.sync(history)
    cr.assert_cache_is_fresh_prefill(padded, history)


def test_a_bounded_cache_is_not_padded():
    state = ModelState(cr.TARGET, max_kv_size=64)
    state.forward([5, 6, 7])
    before = state.positions
    state.forward([8, 9], 16)
    assert state.positions - before == 2 and not state.can_pad


def widths_fed(monkeypatch):
    """The widths of the target's and draft's forward calls, as they run."""
    seen = []
    real = ModelState._call

    def spy(self, x):
        seen.append(x.size)
        return real(self, x)

    monkeypatch.setattr(ModelState, "_call", spy)
    monkeypatch.setattr(TreeBlock, "_call", lambda self, x, m, p, _r=TreeBlock._call: (seen.append(x.size),
                                                                                        _r(self, x, m, p))[1])
    return seen


@pytest.mark.parametrize("tree", [True, False], ids=["trees", "chains"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_equals_plain_with_padded_passes(arch, tree, monkeypatch):
    target, drafts = ge.models(arch)
    seen = widths_fed(monkeypatch)
    for draft in drafts:
        for prompt in ([7, 19, 200, 31, 31, 5], [40, 41, 42], [9]):
            expected = ge.plain(target, prompt)
            dec = SpeculativeDecoder(target, ModelDrafter(draft), PerToken(dipped(0.05, FLAT), 8), tree=tree)
            assert dec.trees == tree
            got = [t for t, _ in dec.generate(list(prompt), max_tokens=ge.MAX_TOKENS)]
            ge.assert_same_or_near_tie(target, prompt, expected, got)
    assert seen.count(16) >= 3, seen  # the passes really were padded


def test_tree_samples_with_padded_passes_match_target_distribution(monkeypatch):
    """Sampling through the whole loop with padded tree passes: still exactly p (chi-square;
    the broken controls of test_tree_loop.py fail this same test)."""
    import tiny_models

    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    target, draft = tiny_models.build(cfg, seed=3, scale=1.5), tiny_models.build(cfg, seed=4, scale=1.5)
    samples = SAMPLES
    seen = widths_fed(monkeypatch)
    probs = sd.exact_sequence_probs(target, sd.PARAMS)
    counts, accepted = sd.sample_sequences(target, draft, sd.PARAMS, k=PerToken(dipped(0.05, FLAT), 3), samples=samples)
    assert accepted > samples // 4 and 16 in seen
    stat, df, pval = chi_square(counts, probs, samples)
    print(f"chi2={stat:.1f} df={df} p={pval:.3g} accepted={accepted}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


def test_chi_square_fails_when_the_nodes_see_the_pads(monkeypatch):
    """The control: a tree mask that lets every node see the positions fed in the same
    call -- the pads after it among them -- changes the real nodes' logits; the same
    chi-square test catches it."""
    import tiny_models

    real = TreeBlock._mask

    def leaky(self, first):
        m = np.array(real(self, first))
        m[:, self.base + first:] = True  # every position of this call, pads included
        import mlx.core as mx

        return mx.array(m)

    monkeypatch.setattr(TreeBlock, "_mask", leaky)
    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    target, draft = tiny_models.build(cfg, seed=3, scale=1.5), tiny_models.build(cfg, seed=4, scale=1.5)
    samples = SAMPLES
    probs = sd.exact_sequence_probs(target, sd.PARAMS)
    counts, _ = sd.sample_sequences(target, draft, sd.PARAMS, k=PerToken(dipped(0.05, FLAT), 3), samples=samples)
    stat, df, pval = chi_square(counts, probs, samples)
    print(f"nodes seeing the pads: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval < 1e-6, f"nodes seeing the pads went unnoticed: p={pval:.2e}"
