"""Trees or chains round by round (mlxspec/tree_choice.py): the rule follows the
measured rates, revisits the slower kind, and the default decoder mixes both kinds
of round without changing its output."""

import tiny_models
from mlxspec.drafters import ModelDrafter
from mlxspec.speculative import SpeculativeDecoder
from mlxspec.stats import GenerationStats
from mlxspec.tree_choice import CHAIN_ROUND, DECAY, REVISIT_EVERY, SWITCH_MARGIN, TreeOrChain
from test_tree_loop import wide


def run(choice: TreeOrChain, rounds: int, rate) -> list[bool]:
    """`rate(tree, i)`: tokens per second a round of that kind gives at round i."""
    kinds = []
    for i in range(rounds):
        tree = choice.tree_next()
        kinds.append(tree)
        choice.observe(tree, 4, 4 / rate(tree, i))
    return kinds


def test_explores_then_takes_the_faster_and_revisits_the_slower():
    choice = TreeOrChain()
    kinds = run(choice, 60, lambda tree, i: 10.0 if tree else 7.0)
    assert kinds[:CHAIN_ROUND + 1] == [True] * CHAIN_ROUND + [False]
    later = kinds[CHAIN_ROUND + 1:]
    assert sum(later) > 0.8 * len(later)  # mostly trees
    assert not all(later)  # chains revisited ...
    gaps = [i for i, k in enumerate(later) if not k]
    assert min(b - a for a, b in zip(gaps, gaps[1:])) >= REVISIT_EVERY  # ... not more often than this
    close = run(TreeOrChain(), 60, lambda tree, i: 10.0 if tree else 9.5)[CHAIN_ROUND + 1:]
    margin = run(TreeOrChain(), 60, lambda tree, i: 10.0 if tree else 10.5)[CHAIN_ROUND + 1:]
    assert SWITCH_MARGIN > 1.05 and sum(margin) > 0.8 * len(margin)  # chains must be clearly faster
    far = run(TreeOrChain(), 60, lambda tree, i: 20.0 if tree else 5.0)[CHAIN_ROUND + 1:]
    assert len(far) - sum(far) < len(close) - sum(close)  # a kind far behind is revisited less
    chains = run(TreeOrChain(), 60, lambda tree, i: 6.0 if tree else 9.0)[CHAIN_ROUND + 1:]
    assert sum(chains) < 0.2 * len(chains) and any(chains)  # mostly chains, trees revisited


def test_follows_a_change_in_the_text():
    """Chains pay first; from round 30 on trees pay (a repetitive stretch): the revisits see it."""
    kinds = run(TreeOrChain(), 120, lambda tree, i: (12.0 if i >= 30 else 5.0) if tree else 8.0)
    assert sum(kinds[12:30]) <= 18 // REVISIT_EVERY + 1  # chains, trees revisited now and then
    assert sum(kinds[90:]) >= 0.75 * len(kinds[90:])  # trees, once revisits have seen them pay
    assert 0 < DECAY < 1


def test_the_default_mixes_trees_and_chains_and_keeps_plain_output():
    cfg = tiny_models.config_for("llama")
    target = tiny_models.build(cfg, seed=11, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.03, seed=5)
    for prompt in ([7, 8, 9], [3, 3, 3, 3, 5]):
        stats = GenerationStats()
        dec = SpeculativeDecoder(target, ModelDrafter(draft), wide())
        got = [t for t, _ in dec.generate(list(prompt), max_tokens=40, stats=stats)]
        assert got == [t for t, _ in SpeculativeDecoder(target).generate(list(prompt), max_tokens=40)]
        drafted = sum(1 for k in stats.k_history if k)
        assert 0 < stats.tree_rounds < drafted, (stats.tree_rounds, drafted)
