"""benchmarks/priced_rounds.py: it sees every round's target pass and draft forwards
(prefill not counted), prices them by the cost model, and restores the models'
methods afterwards."""

import pytest

import test_greedy_equality as ge
from bench_util import load_benchmark
from mlxspec.core import cache
from mlxspec.trees import attention as tree_attention
from mlxspec.costs.cost_model import CostModel
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats


def originals():
    return cache.ModelState._call, tree_attention.TreeBlock._call, cache.ModelState.prefill


@pytest.mark.parametrize("tree", [True, False])
def test_every_forward_of_the_rounds_is_priced(tree):
    priced_rounds = load_benchmark("priced_rounds")
    target, drafts = ge.models("llama")
    prompt = [7, 19, 200, 31, 31, 5]
    cm = CostModel(0.25, [1.0 + 0.1 * w for w in range(40)])
    decoder = SpeculativeDecoder(target, ModelDrafter(drafts[0]), PerToken(cm, 6), tree=tree)
    before = originals()
    stats = GenerationStats()
    with priced_rounds.Widths() as widths:
        out = [t for t, _ in decoder.generate(list(prompt), max_tokens=ge.MAX_TOKENS, stats=stats)]
    assert originals() == before
    assert out == ge.plain(target, prompt)
    on_target = [w for state, w in widths.log if state is decoder.target]
    assert len(on_target) == stats.target_passes  # one pass a round; the prompt's prefill is not there
    assert sum(w for state, w in widths.log if state is not decoder.target) >= stats.draft_proposed - stats.target_passes
    verify, draft = priced_rounds.priced(decoder, widths.log)
    assert verify == pytest.approx(sum(1.0 + 0.1 * (w - 1) for w in on_target))
    assert draft > 0
