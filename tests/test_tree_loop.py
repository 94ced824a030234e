"""Token trees through the whole speculative loop: greedy output equals plain
decoding; sampled 3-token sequences follow the target's exact distribution
(chi-square), and a deliberately broken sibling rule fails the same test; after
any round both caches hold exactly the kept tokens."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drafter_models
import test_greedy_equality as ge
import test_sequence_distribution as sd
from mlxspec.trees import acceptance as tree_acceptance
from mlxspec.core.cache import ModelState
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import LayerSkipDrafter, ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from mlxspec.trees.round import MODEL_TYPE
from stats_util import chi_square


TREE_SAMPLES = 500  # the broken control below fails at p ~ 2e-12 with these (6.6e-16 at 600; threshold 1e-6);
# sound trees pass at p > 0.2


def wide(max_k=8):
    """A cost model where verify width is free and drafting cheap: trees grow wide and deep."""
    return PerToken(assumed(0.05, slope=0.0, width=40), max_k)


@pytest.mark.parametrize("kind", ["model", "subset"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(5, 299), min_size=1, max_size=20), which=st.integers(0, 1),
       max_k=st.integers(1, 8))
def test_tree_greedy_equals_plain(kind, arch, prompt, which, max_k):
    target, drafter, prompt = ge.setup(kind, arch, which, prompt)
    expected = ge.plain(target, prompt)
    dec = SpeculativeDecoder(target, drafter, wide(max_k), tree=True)
    assert dec.trees, dec.tree_note
    h = list(prompt)
    got = [t for t, _ in dec.generate(h, max_tokens=ge.MAX_TOKENS)]
    ge.assert_same_or_near_tie(target, prompt, expected, got)
    assert h == list(prompt) + got


def test_trees_branch_and_siblings_get_taken():
    """The trees really are trees: more nodes than depth, and accepted later
    siblings (tokens a chain would have lost) on a fixed prompt."""
    taken = nodes = depth = 0
    for arch in ("llama", "qwen2"):
        target, drafts = ge.models(arch)
        for draft in drafts:
            stats = GenerationStats()
            prompt = [7, 19, 200, 31, 31, 5]
            got = [t for t, _ in SpeculativeDecoder(target, ModelDrafter(draft), wide(), tree=True).generate(
                list(prompt), max_tokens=ge.MAX_TOKENS, stats=stats)]
            assert got == ge.plain(target, prompt)
            taken += stats.tree_siblings_taken
            nodes += stats.tree_nodes
            depth += stats.tree_depth
    assert nodes > depth and taken > 0, (nodes, depth, taken)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lookup_branches_join_the_tree(arch):
    """On input-grounded text, prompt lookup's continuation is a branch of the tree
    (beside a poor draft model's): its nodes get accepted, the output is still plain's."""
    import tiny_models

    target = drafter_models.lookup_target(arch)
    draft = tiny_models.perturbed(target, tiny_models.config_for(arch), noise=0.5, seed=3)
    taken = 0
    for prompt in ([7, 19, 200, 31], [40, 41, 42, 43, 44]):
        prompt = drafter_models.grounded_prompt(target, prompt)
        stats = GenerationStats()
        dec = SpeculativeDecoder(target, ModelDrafter(draft), wide(), tree=True)
        got = [t for t, _ in dec.generate(list(prompt), max_tokens=ge.MAX_TOKENS, stats=stats)]
        ge.assert_same_or_near_tie(target, prompt, ge.plain(target, prompt), got)
        taken += stats.tree_lookup_taken
    assert taken > 0


def test_caches_hold_exactly_the_kept_tokens():
    target, drafts = ge.models("qwen2")
    dec = SpeculativeDecoder(target, ModelDrafter(drafts[1]), wide(), tree=True)
    rng = np.random.default_rng(0)
    for _ in range(4):
        h = rng.integers(5, 299, int(rng.integers(1, 12))).tolist()
        for t, _ in dec.generate(h, max_tokens=int(rng.integers(1, 20))):
            pass
        for state, lag in ((dec.target, 2), (dec.drafter.state, 9)):
            # the draft never fed the leaf it proposed, nor a lookup branch's nodes: the next round's sync does
            fresh = ModelState(state.model)
            fresh.forward(state.tokens)
            assert state.tokens == h[: len(state.tokens)] and len(state.tokens) >= len(h) - lag
            for c, f in zip(state.cache, fresh.cache):
                assert c.offset == f.offset
                k, v = c.keys_and_values()
                fk, fv = f.keys_and_values()
                np.testing.assert_allclose(np.array(k), np.array(fk), atol=2e-4, rtol=1e-4)
                np.testing.assert_allclose(np.array(v), np.array(fv), atol=2e-4, rtol=1e-4)


def tree_samples(models, params, samples=TREE_SAMPLES):
    target, draft = models
    return sd.sample_sequences(target, draft, params, k=wide(3), samples=samples)


@pytest.mark.parametrize("params", [sd.PARAMS, sd.SamplingParams(temp=0.8, top_k=5, repetition_penalty=1.3)],
                         ids=["temp1", "temp0.8-topk5-penalty"])
def test_tree_samples_match_target_sequence_distribution(models, params):
    target, _ = models
    probs = sd.exact_sequence_probs(target, params)
    counts, accepted = tree_samples(models, params)
    assert accepted > TREE_SAMPLES // 4
    stat, df, pval = chi_square(counts, probs, TREE_SAMPLES)
    print(f"chi2={stat:.1f} df={df} p={pval:.3g} accepted={accepted}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


def test_tree_samples_with_lookup_branches_match_target_distribution(models, monkeypatch):
    """One-hot lookup branches beside sampled draft children: still exactly p.  A
    target whose next token depends mostly on the current one, on a prompt that
    quotes its own continuation: lookup branches get taken (one draft child per
    node, so that the lookup token is not already among them)."""
    from mlxspec.trees import drafter as tree_drafter

    monkeypatch.setattr(tree_drafter, "MAX_BRANCH", 1)
    _, draft = models
    target = drafter_models.lookup_target("llama", vocab_size=sd.V, hidden=32, ffn=64)
    prompt = drafter_models.grounded_prompt(target, [1, 5, 2], n=4)
    taken = []
    record = GenerationStats.record_tree
    monkeypatch.setattr(GenerationStats, "record_tree",
                        lambda self, *a: (taken.append(a[4]), record(self, *a))[1])
    probs = sd.exact_sequence_probs(target, sd.PARAMS, prompt=prompt)
    counts, accepted = sd.sample_sequences(target, draft, sd.PARAMS, k=wide(3), prompt=prompt, samples=TREE_SAMPLES)
    assert sum(taken) > TREE_SAMPLES // 10, sum(taken)
    stat, df, pval = chi_square(counts, probs, TREE_SAMPLES)
    print(f"chi2={stat:.1f} df={df} p={pval:.3g} accepted={accepted}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


def test_chi_square_fails_when_siblings_see_the_unchanged_target(models, monkeypatch):
    """The control: trying each sibling against p itself (no residual after a
    rejected sibling) over-produces the siblings' tokens; the same test catches it."""

    def broken(p, tokens, qs):
        r = np.asarray(p, dtype=np.float64) / np.sum(p)
        out, reach = np.zeros_like(r), 1.0
        for x, q in zip(tokens, qs):
            q = tree_acceptance._proposal(q, x, r.size)
            a = min(1.0, r[x] / q[x]) if q[x] > 0 else 0.0
            out[x] += reach * a
            reach *= 1.0 - a
        rest = np.maximum(r - q, 0.0) if tokens else r
        return out + reach * (rest / rest.sum() if rest.sum() > 0 else r)

    monkeypatch.setattr(tree_acceptance, "node_outcome", broken)
    target, _ = models
    probs = sd.exact_sequence_probs(target, sd.PARAMS)
    counts, _ = tree_samples(models, sd.PARAMS)
    stat, df, pval = chi_square(counts, probs, TREE_SAMPLES)
    print(f"siblings against p: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval < 1e-6, f"siblings tried against the unchanged target went unnoticed: p={pval:.2e}"


@pytest.fixture(scope="module")
def models():
    """The sequence-distribution test's pair: V=8, an unrelated draft (many rejections)."""
    import tiny_models

    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    return tiny_models.build(cfg, seed=3, scale=1.5), tiny_models.build(cfg, seed=4, scale=1.5)


def chain_notes(dec) -> list:
    stats = GenerationStats()
    list(dec.generate([7, 19, 200, 31, 31, 5], max_tokens=4, stats=stats))
    return [n for n in stats.notes if n.startswith("verifying chains")]


def test_no_tree_and_unsupported_drafters_verify_chains():
    """A chain drafter or a fixed k verifies chains as the user chose: a note in the stats
    only where trees were asked for (tree=True)."""
    from mlxspec.costs.draft_length import FixedK
    from mlxspec.drafting.drafters import PromptLookupDrafter
    from mlxspec.trees.round import DRAFTER, FIXED_K

    target, drafts = ge.models("llama")
    assert not SpeculativeDecoder(target, ModelDrafter(drafts[0]), wide(), tree=False).trees
    for make, kind, phrase in ((lambda: LayerSkipDrafter(target), DRAFTER, "layer-skip"),
                               (lambda: PromptLookupDrafter(), DRAFTER, "lookup drafter"),
                               (lambda: ModelDrafter(drafts[0]), FIXED_K, "--num-draft auto")):
        for tree in (None, True):
            policy = FixedK(3) if kind == FIXED_K else wide()
            dec = SpeculativeDecoder(target, make(), policy, tree=tree)
            assert not dec.trees and dec.tree_note.kind == kind and phrase in dec.tree_note.text
            notes = chain_notes(dec)
            assert notes == ([f"verifying chains: {dec.tree_note.text}"] if tree else []), (phrase, tree, notes)


def test_a_model_without_tree_support_says_so_and_verifies_chains():
    import tiny_models

    cfg = tiny_models.config_for("llama")
    target = tiny_models.build(cfg, seed=11, scale=3.0)
    target.model_type = "exotic"  # as a model class tree attention was never checked for
    draft = tiny_models.perturbed(target, cfg, noise=0.03, seed=5)
    dec = SpeculativeDecoder(target, ModelDrafter(draft), wide())
    stats = GenerationStats()
    got = [t for t, _ in dec.generate([7, 8, 9], max_tokens=12, stats=stats)]
    assert not dec.trees and stats.tree_rounds == 0 and stats.draft_proposed > 0
    assert dec.tree_note.kind == MODEL_TYPE  # noted although trees were not asked for: unexpected
    assert any("verifying chains" in n and "'exotic'" in n for n in stats.notes), stats.notes
    assert got == ge.plain(target, [7, 8, 9])[:12]


@pytest.mark.real
def test_cli_tree_and_no_tree(tmp_path, monkeypatch, smollm2_pair):
    """`generate --json` on the real SmolLM2-135M drafting for itself: trees by default
    (their figures in the stats), chains with --no-tree; the same greedy text.  The
    pair's cost model is given (a cached calibration saying drafting costs 0.3 of a
    target step): this machine's own would make a model drafting for itself dear, and
    trees rare (one round in 24 tokens), besides a calibration run."""
    import json
    from types import SimpleNamespace

    from cli_util import run_cli
    from mlxspec.costs import calibration as calibration_cache, cost_model

    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path / "calibration"))  # save's folder, and the CLI's
    # the key of the pair as the CLI loads it (its folders and its weights' layout, cpu/blas_layout.py)
    drafter = SimpleNamespace(uses_draft_model=True, name=ModelDrafter.name)
    calibration_cache.save(calibration_cache.cache_key(smollm2_pair, drafter), cost_model.assumed(0.3))
    base = ("generate", "--model", "smollm2-135m", "--draft", "smollm2-135m", "-p", "def fibonacci(n):",
            "--ignore-chat-template", "-m", "12", "--json")
    out = {}
    for flag in ("--tree", "--no-tree"):
        res = run_cli(tmp_path, *base, flag)
        assert res.returncode == 0, res.stderr
        assert "calibrating" not in res.stderr  # the given cost model was found
        out[flag] = json.loads(res.stdout)
    assert out["--tree"]["tokens"] == out["--no-tree"]["tokens"]
    assert out["--tree"]["stats"]["tree"]["rounds"] > 0
    assert out["--no-tree"]["stats"]["tree"] is None


def test_a_tree_with_one_child_per_node_makes_the_chains_decisions(monkeypatch):
    """The tree budget is the chain rule generalised: with one child per node and no
    lookup branch, every round stops where the chain's would (same passes, drafts
    kept, stop reasons)."""
    from mlxspec.trees import drafter as tree_drafter

    monkeypatch.setattr(tree_drafter, "MAX_BRANCH", 1)
    for arch in ("llama", "qwen2"):
        target, drafts = ge.models(arch)
        for draft in drafts:
            seen = []
            for tree in (False, None):
                dec = SpeculativeDecoder(target, ModelDrafter(draft), PerToken(assumed(0.3), 8), tree=tree)
                dec.lookup = None
                stats = GenerationStats()
                out = [t for t, _ in dec.generate([7, 19, 200, 31, 31, 5], max_tokens=40, stats=stats)]
                seen.append((out, stats.target_passes, stats.draft_accepted, stats.stop_reasons))
            assert dec.trees and seen[0] == seen[1], seen


def test_session_verifies_trees_by_default_and_chains_with_tree_false(tiny_pair):
    """Session builds its decoder before drafting is switched on: trees follow the
    drafter and policy in use (and a toggled-off session decodes plainly)."""
    from mlxspec.session.session import Session

    replies = {}
    for tree in (None, False):
        s = Session(tiny_pair, max_tokens=16, tree=tree)
        assert s.decoder.trees == (tree is None), s.decoder.tree_note
        s.decoder.policy.cost = wide().cost  # drafting pays whatever this machine's calibration of the tiny pair says
        stream = s.stream("a message to answer")
        for _ in stream:
            pass
        replies[tree] = stream.tokens
        assert (stream.stats.tree_rounds > 0) == (tree is None), stream.stats.tree_rounds
        s.drafting = False
        assert not s.decoder.trees
    assert replies[None] == replies[False]


def test_sibling_feedback_uses_the_drafts_own_probabilities():
    """The sibling scale learns from what the draft gave the later siblings, not from
    their capped estimates divided back by a scale that moves as the walk goes on."""
    from types import SimpleNamespace

    from mlxspec.costs.draft_length import DECAY
    from mlxspec.trees.tree import DraftTree
    from mlxspec.trees.round import _outcomes

    policy = PerToken(assumed(0.2), 4)
    policy.siblings = [3.0, 1.0]  # later siblings have been taken 3x as often as the draft said
    scale = policy.sibling_scale()
    tree = DraftTree()
    a = tree.add(5, -1, None, 0.6, 0.6, 0.6)
    b = tree.add(6, -1, None, 0.6, min(1.0, 0.4 * scale), 0.4)  # estimate capped at 1.0
    tree.add(7, b, None, 0.5, 0.5, 0.5)
    c = tree.add(8, b, None, 0.5, min(1.0, 0.45 * scale), 0.45)
    assert tree.estimate[b] == 1.0 and a == 0
    _outcomes(tree, SimpleNamespace(expanded=[-1, b]), [b, c], policy)
    taken, predicted = 3.0, 1.0
    for p in (0.4, 0.45):  # root level, then b's level: each sibling taken
        taken, predicted = DECAY * taken + 1, DECAY * predicted + p
    assert policy.siblings == pytest.approx([taken, predicted])
