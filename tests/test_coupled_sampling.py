"""Coupled sampling (issue 59, core/coupled.py): with a seed, speculative output is
the plain run's token for token -- chains at several fixed k and auto, trees,
prompt lookup, hybrid drafting, recurrent targets, top-p/top-k, a Session's second
turn, and two processes drafting different lengths -- and it is still exactly
distributed as p (sequence chi-square over seeds), where a broken control (one
noise for every position instead of one per position) fails the same test.
Greedy is untouched."""

import json
import os
import subprocess
import sys

import pytest

import drafter_models
import test_sequence_distribution as sd
import tiny_hybrid
import tiny_models
from mlxspec.core import coupled
from mlxspec.core.options import BadValue
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.stats import GenerationStats
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.drafting.drafters import ModelDrafter, PromptLookupDrafter
from mlxspec.drafting.hybrid import HybridDrafter
from stats_util import chi_square

TOKENS = 40
PROMPTS = ([1, 5, 2], [7, 19, 200, 31, 31, 5, 9, 12])
PARAMS = [SamplingParams(temp=1.0, seed=11), SamplingParams(temp=0.7, seed=12, top_p=0.9),
          SamplingParams(temp=0.8, seed=13, top_k=20), SamplingParams(temp=1.0, seed=14, min_p=0.05,
                                                                       repetition_penalty=1.2)]


@pytest.fixture(scope="module")
def pair():
    cfg = tiny_models.config_for("llama")
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.05, seed=1)  # close: long accepted runs
    return target, draft


def run(target, drafter, policy, prompt, params, tokens=TOKENS, tree=None, stats=None):
    dec = SpeculativeDecoder(target, drafter, policy, tree=tree)
    return [t for t, _ in dec.generate(list(prompt), params, max_tokens=tokens, stats=stats)], dec


def plain(target, prompt, params, tokens=TOKENS):
    return run(target, None, FixedK(0), prompt, params, tokens)[0]


def auto(max_k=8, drafter=None):
    lookup = drafter is not None and getattr(drafter, "proposes_lookup", False)
    return PerToken(assumed(0.05), max_k, lookup=lookup or isinstance(drafter, PromptLookupDrafter),
                    model=drafter is None or drafter.uses_draft_model)


def wide(max_k=8):
    """Width free, drafting cheap: trees grow wide and deep (as test_tree_loop.wide)."""
    return PerToken(assumed(0.05, slope=0.0, width=40), max_k)


def test_defaults():
    assert SamplingParams(temp=0.7, seed=1).coupled
    assert not SamplingParams(temp=0.7).coupled  # no seed: rejection sampling, as before
    assert not SamplingParams(temp=0.7, seed=1, sampling="rejection").coupled
    assert SamplingParams(temp=0.7, sampling="coupled").coupled  # a random seed, still exact
    assert not SamplingParams(seed=1, sampling="coupled").coupled  # greedy stays greedy
    with pytest.raises(BadValue, match="sampling must be 'coupled' or 'rejection'"):
        SamplingParams(temp=1.0, sampling="gumbel")


def test_noise_is_fixed_by_seed_and_position():
    """The documented derivation, pinned: splitmix64(splitmix64(seed) + t) seeds MLX's key."""
    assert coupled.splitmix64(0) == 0xE220A8397B1DCDAF  # splitmix64's published first output for state 0
    a = coupled.gumbel_at(5, 100, 16).tolist()
    assert a == coupled.Coupling(5).noise(100, 16).tolist()
    assert a != coupled.gumbel_at(5, 101, 16).tolist() and a != coupled.gumbel_at(6, 100, 16).tolist()


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, "auto"])
def test_chains_equal_plain(pair, k):
    target, draft = pair
    for params in PARAMS:
        for prompt in PROMPTS:
            expected = plain(target, prompt, params)
            policy = auto() if k == "auto" else FixedK(k)
            stats = GenerationStats()
            got, _ = run(target, ModelDrafter(draft), policy, prompt, params, stats=stats, tree=False)
            assert got == expected, (k, params, prompt)
            assert stats.draft_accepted > 0  # speculation really happened


def test_rejection_sampling_differs_by_k(pair):
    """The issue itself: under rejection sampling the same seed gives different text at
    different draft lengths (so the equality tests above have power)."""
    target, draft = pair
    params = SamplingParams(temp=1.0, seed=11, sampling="rejection")
    outs = {tuple(run(target, ModelDrafter(draft), FixedK(k), PROMPTS[1], params, tree=False)[0])
            for k in (0, 1, 3, 8)}
    assert len(outs) > 1


def test_draft_with_other_noise_still_equals_plain(pair, monkeypatch):
    """The target decides every token: a draft proposing under different noise only
    loses acceptance, never changes the text."""
    target, draft = pair
    params = PARAMS[0]
    expected = plain(target, PROMPTS[1], params)
    real = coupled.Coupling.choose
    import mlxspec.drafting.drafters as drafters_mod

    class OtherNoise(coupled.Coupling):
        def choose(self, logprobs, positions):
            return real(self, logprobs, [t + 1000 for t in positions])

    orig_propose = drafters_mod.ModelDrafter.propose

    def propose(self, history, k, params, key, rnd=None):
        if isinstance(key, coupled.Coupling):
            key = OtherNoise(key.seed)
        return orig_propose(self, history, k, params, key, rnd)

    monkeypatch.setattr(drafters_mod.ModelDrafter, "propose", propose)
    s_other = GenerationStats()
    got, _ = run(target, ModelDrafter(draft), FixedK(4), PROMPTS[1], params, stats=s_other, tree=False)
    assert got == expected
    monkeypatch.undo()
    s_same = GenerationStats()
    run(target, ModelDrafter(draft), FixedK(4), PROMPTS[1], params, stats=s_same, tree=False)
    assert s_same.draft_accepted > s_other.draft_accepted


@pytest.mark.parametrize("kind", ["subset", "layerskip"])
def test_pruned_head_and_layer_skip_equal_plain(pair, kind):
    """A pruned draft head (q over the subset, scattered to the target's rows) and
    self-speculation propose under the same noise entries."""
    target, draft = pair
    accepted = 0
    for params in PARAMS[:2]:
        expected = plain(target, PROMPTS[1], params)
        for k in (2, 5):
            stats = GenerationStats()
            got, _ = run(target, drafter_models.make(kind, target, draft), FixedK(k), PROMPTS[1], params,
                         stats=stats, tree=False)
            assert got == expected, (kind, k, params)
            accepted += stats.draft_accepted
    assert accepted > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_trees_equal_plain(arch):
    cfg = tiny_models.config_for(arch)
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.1, seed=2)
    for params in PARAMS[:3]:
        for prompt in PROMPTS:
            expected = plain(target, prompt, params)
            stats = GenerationStats()
            got, dec = run(target, ModelDrafter(draft), wide(), prompt, params, tree=True, stats=stats)
            assert dec.trees, dec.tree_note
            assert got == expected, (arch, params, prompt)
    assert stats.draft_accepted > 0


def test_lookup_equals_plain():
    target = drafter_models.lookup_target("llama")
    for params in PARAMS[:3]:
        prompt = drafter_models.grounded_prompt(target, [5, 9, 14])
        expected = plain(target, prompt, params)
        for policy in (FixedK(4), auto(drafter=PromptLookupDrafter(max_ngram=3, min_ngram=1))):
            got, _ = run(target, PromptLookupDrafter(max_ngram=3, min_ngram=1), policy, prompt, params)
            assert got == expected


def test_hybrid_equals_plain(pair):
    target, draft = pair
    for params in PARAMS:
        prompt = PROMPTS[1] * 3
        expected = plain(target, prompt, params)
        for policy in (FixedK(5), None):
            drafter = HybridDrafter(PromptLookupDrafter(max_ngram=3, min_ngram=1), ModelDrafter(draft))
            got, _ = run(target, drafter, policy or auto(drafter=drafter), prompt, params)
            assert got == expected


@pytest.mark.parametrize("name", ["qwen3_5+qwen2", "mamba2+qwen3_5", "lfm2+lfm2", "mamba2+lookup"])
def test_recurrent_targets_equal_plain(name):
    """Rollback of recurrent state (re-fed positions) never moves a position's noise."""
    target, draft = _hybrid_pairs()[name]
    prompt = [3, 8, 21, 40, 8, 21, 40, 9]
    for params in PARAMS[:2]:
        expected = plain(target, prompt, params, tokens=24)
        for policy in (FixedK(3), FixedK(6)):
            drafter = PromptLookupDrafter(max_ngram=3, min_ngram=1) if draft is None else ModelDrafter(draft)
            got, _ = run(target, drafter, policy, prompt, params, tokens=24)
            assert got == expected, (name, params)


_PAIRS = {}


def _hybrid_pairs():
    if not _PAIRS:
        _PAIRS.update(tiny_hybrid.pairs())
    return _PAIRS


def test_session_second_turn_equals_plain(tiny_pair):
    from mlxspec.session.session import Session

    outs = []
    for kw in (dict(num_draft=3), dict(num_draft="auto"), dict(drafting=False)):
        s = Session(tiny_pair, max_tokens=16, temp=0.9, seed=21, **kw)
        first = s.send("hello, this is the first message of a conversation")
        second = s.send("and a second message")
        outs.append((first.tokens, second.tokens))
    assert outs[0] == outs[1] == outs[2]


_CHILD = r"""
import json, sys
sys.path.insert(0, "tests")
import tiny_models
from mlxspec.core.sampling import SamplingParams
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.core.stats import GenerationStats
cfg = tiny_models.config_for("llama")
target = tiny_models.build(cfg, seed=0, scale=3.0)
draft = tiny_models.perturbed(target, cfg, noise=0.05, seed=1)
how = sys.argv[1]
policy = FixedK(int(how)) if how.isdigit() else PerToken(assumed(float(how[4:])), 8)
s = GenerationStats()
dec = SpeculativeDecoder(target, ModelDrafter(draft), policy, tree=False)
out = [t for t, _ in dec.generate([7, 19, 200, 31], SamplingParams(temp=1.0, seed=99), max_tokens=48, stats=s)]
print(json.dumps([out, s.k_history]))
"""


def test_two_processes_with_different_draft_lengths_agree():
    """Other processes, other calibrations: plain, k = 2, k = 7, auto with a cheap and a
    dear draft -- different draft lengths, the same text."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    runs = {}
    for how in ("0", "2", "7", "auto0.02", "auto0.2"):  # at 0.6 the tiny pair stays plain
        r = subprocess.run([sys.executable, "-c", _CHILD, how], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[how] = json.loads(r.stdout.strip().splitlines()[-1])
    texts = {tuple(out) for out, _ in runs.values()}
    assert len(texts) == 1, runs
    assert len({tuple(k) for _, k in runs.values()}) == len(runs)  # the draft lengths really differed


def test_greedy_is_unchanged(pair):
    target, draft = pair
    for prompt in PROMPTS:
        expected = plain(target, prompt, SamplingParams())
        for params in (SamplingParams(seed=3), SamplingParams(seed=3, sampling="coupled")):
            for k in (0, 4):
                assert run(target, ModelDrafter(draft), FixedK(k), prompt, params, tree=False)[0] == expected


# ---------------------------------------------------------------------------
# Exactness: 3-token sequences over V = 8 against the exact sequence distribution.

COUPLED_SAMPLES = 1000


def _sequences(target, draft, k, samples=COUPLED_SAMPLES):
    params = SamplingParams(temp=1.0, sampling="coupled")
    counts = {}
    dec = SpeculativeDecoder(target, ModelDrafter(draft), FixedK(k) if isinstance(k, int) else k)
    for i in range(samples):
        p = SamplingParams(**{**params.to_dict(), "seed": 1000 + i})
        seq = tuple(t for t, _ in dec.generate(list(sd.PROMPT), p, max_tokens=sd.LENGTH))
        counts[seq] = counts.get(seq, 0) + 1
    return counts


@pytest.mark.parametrize("k", [0, 2])
def test_coupled_sequences_follow_p(k):
    target, draft = _sd_models()
    expected = sd.exact_sequence_probs(target, SamplingParams(temp=1.0))
    _, _, p = chi_square(_sequences(target, draft, k), expected, COUPLED_SAMPLES)
    assert p > 1e-3, p


def test_control_one_noise_for_all_positions_fails(monkeypatch):
    """Noise keyed by the seed alone (the same g at every position): each token is
    still a draw from its p, but the tokens are no longer independent given p -- the
    sequence test catches it."""
    target, draft = _sd_models()
    monkeypatch.setattr(coupled, "position_seed", lambda seed, position: coupled.splitmix64(seed))
    expected = sd.exact_sequence_probs(target, SamplingParams(temp=1.0))
    _, _, p = chi_square(_sequences(target, draft, 2), expected, COUPLED_SAMPLES)
    assert p < 1e-6, p


def _sd_models():
    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    return tiny_models.build(cfg, seed=3, scale=1.5), tiny_models.build(cfg, seed=4, scale=1.5)
