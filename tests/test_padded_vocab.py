"""A draft whose vocabulary table is padded to more rows than the target's (checkpoints
pad differently: Qwen2.5-7B has 152064 rows, its 0.5B draft 151936): the draft's
logits are cut to the target's rows (token_ids.fit_rows), so no id the target has no
row for is ever drafted -- the target read past its table (garbage, NaN logits: a
one-off CI failure in a tree round) -- and q lines up with p column for column (at
temperature > 0 the acceptance rule raised a broadcast error).  Greedy output is
plain's; sampled sequences follow the target's exact distribution, chains and trees,
and a control that cuts q after normalising it fails."""

import mlx.core as mx
import numpy as np
import pytest

import test_greedy_equality as ge
import test_sequence_distribution as sd
import tiny_models
from mlxspec.core import cache, token_ids
from mlxspec.drafting import drafters
from mlxspec import cpu
from mlxspec.trees import attention as tree_attention
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from stats_util import chi_square


def wide(max_k=6):
    return PerToken(assumed(0.05, slope=0.02, width=40), max_k)


def test_fit_rows_cuts_or_fills():
    x = mx.array([[1.0, 2.0, 3.0, 4.0]])
    assert token_ids.fit_rows(x, None) is x and token_ids.fit_rows(x, 4) is x
    assert token_ids.fit_rows(x, 3).tolist() == [[1.0, 2.0, 3.0]]
    filled = np.array(token_ids.fit_rows(x, 6))
    assert filled[0, :4].tolist() == [1.0, 2.0, 3.0, 4.0] and np.isneginf(filled[0, 4:]).all()


@pytest.mark.parametrize("tree", [True, False], ids=["trees", "chains"])
def test_no_id_past_the_targets_table_is_drafted(tree, monkeypatch):
    target = tiny_models.make_model("llama", 300, seed=0)
    draft = tiny_models.make_model("llama", 384, seed=2)  # its 84 extra rows score like any other
    fed = []
    forward, block_forward = cache.ModelState.forward, tree_attention.TreeBlock.forward

    def spy(state, tokens, *args, **kwargs):
        if state.model is target:
            fed.extend(tokens)
        return forward(state, tokens, *args, **kwargs)

    def block_spy(block, tokens, *args, **kwargs):
        if block.state.model is target:
            fed.extend(tokens)
        return block_forward(block, tokens, *args, **kwargs)

    monkeypatch.setattr(cache.ModelState, "forward", spy)
    monkeypatch.setattr(tree_attention.TreeBlock, "forward", block_spy)
    rng = np.random.default_rng(0)
    for _ in range(12):
        prompt = [int(t) for t in rng.integers(3, 299, 4)]
        dec = SpeculativeDecoder(target, ModelDrafter(draft), wide(), tree=tree, vocab_size=300)
        got = [t for t, _ in dec.generate(list(prompt), max_tokens=ge.MAX_TOKENS)]
        ge.assert_same_or_near_tie(target, prompt, ge.plain(target, prompt), got)
    assert fed and max(fed) < 300


@pytest.fixture(scope="module")
def padded():
    """The sequence-distribution test's target (V = 8 rows) and a draft with 4 more."""
    target, draft = sd.models.__wrapped__()
    cfg = tiny_models.config_for("llama", vocab_size=sd.V + 4, hidden=32, ffn=64)
    return target, tiny_models.build(cfg, seed=4, scale=1.5)


def _pvalue(target, draft, policy):
    probs = sd.exact_sequence_probs(target, sd.PARAMS)
    counts, accepted = sd.sample_sequences(target, ModelDrafter(draft), sd.PARAMS, k=policy)
    assert accepted > sd.SAMPLES // 4
    return chi_square(counts, probs, sd.SAMPLES)[2]


@pytest.mark.parametrize("policy", [lambda: FixedK(2), lambda: wide(3)], ids=["chains", "trees"])
def test_sampled_sequences_are_the_targets_with_a_padded_draft(padded, policy):
    assert _pvalue(*padded, policy()) > 1e-3


def test_cutting_q_after_normalising_it_fails_the_same_test(padded, monkeypatch):
    """The control: the extra columns cut after q is normalised over all 12 rows, so the
    q the rule divides by is short of the mass the token was drawn with.  (q is taken as
    the exp of those log-probabilities: kernel_ops.probabilities' softmax would make the
    cut row whole again -- the distribution the token was drawn from, which passes.)"""
    monkeypatch.setattr(cpu, "probabilities", mx.exp)  # what the drafters call (cpu/__init__.py)
    process = drafters.process_logits
    monkeypatch.setattr(drafters, "fit_rows", lambda logits, rows: logits)
    monkeypatch.setattr(drafters, "process_logits", lambda *a: process(*a)[..., :sd.V])
    assert _pvalue(*padded, FixedK(2)) < 1e-3
