"""benchmarks/round_phases.py: its timing wrappers see every round of trees and
chains (one target forward per round, the draft's forwards, a tree's
distributions and commits), leave the output unchanged, and are removed again."""

import pytest

import test_greedy_equality as ge
from bench_util import load_benchmark
from mlxspec.core import cache
from mlxspec import decoder as speculative
from mlxspec.trees import attention as tree_attention, drafter as tree_drafter, round as tree_round
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder


@pytest.fixture(scope="module")
def round_phases():
    return load_benchmark("round_phases")


def originals():
    return (tree_attention.TreeBlock.forward, tree_attention.TreeBlock.commit, cache.ModelState.forward,
            tree_drafter.TreeDraft._distributions, speculative.run_tree_round,
            speculative.SpeculativeDecoder._chain_round)


@pytest.mark.parametrize("tree", [True, False])
def test_every_round_is_timed_and_the_output_is_unchanged(round_phases, tree):
    target, drafts = ge.models("llama")
    prompt = [7, 19, 200, 31, 31, 5]
    before = originals()
    decoder = SpeculativeDecoder(target, ModelDrafter(drafts[0]), PerToken(assumed(0.05, slope=0.0, width=40), 6),
                                 tree=tree)
    phases = round_phases.Phases()
    out = phases.generate("x", decoder, prompt, ge.MAX_TOKENS)
    assert out == ge.plain(target, prompt)
    assert originals() == before  # nothing stays wrapped
    assert speculative.run_tree_round is tree_round.run_tree_round

    report = phases.report("x", len(out))
    rows, rounds = report["phases"], report["rounds"]
    assert rounds >= 2 and report["tokens_per_round"] > 1.0  # the drafts were taken
    target_calls = sum(v["calls_per_round"] for k, v in rows.items() if k.startswith("target forward"))
    assert target_calls == pytest.approx(1.0)  # one verify pass per round, prefill not counted
    assert any(k.startswith("draft forward") for k in rows)
    assert ("draft distributions" in rows) == tree and ("target commit" in rows) == tree
    parts = sum(v["ms_per_round"] for k, v in rows.items() if k not in ("round", "rest"))
    assert parts <= rows["round"]["ms_per_round"] + 0.5  # the phases are inside the round (rounding)
