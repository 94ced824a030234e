"""Greedy speculative output is token-identical to plain greedy decoding of the target,
for every drafter (draft model, draft model with a pruned vocabulary, hybrid lookup +
model, prompt lookup, layer skip) and every policy (fixed k, the per-token policy
with the drafter's own cost estimate, and with a cost model under which drafting is
cheap, so that rounds vary in length token by token).

Where float non-associativity makes the batched verify flip a near-tie, the test
accepts the divergence only if the target's top-2 logit gap at that position is
below NEAR_TIE (float32 logits of these tiny models are O(10); the batched and
the one-token forward differ by ~1e-6)."""

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drafter_models
import tiny_models
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats

NEAR_TIE = 1e-4
MAX_TOKENS = 24

MODELS = {}


def models(arch):
    if arch not in MODELS:
        cfg = tiny_models.config_for(arch)
        target = tiny_models.build(cfg, seed=11, scale=3.0)
        drafts = [tiny_models.perturbed(target, cfg, noise=n, seed=5) for n in (0.005, 0.03)]
        MODELS[arch] = (target, drafts)
    return MODELS[arch]


DRAFTERS = ["model", "subset", "hybrid", "lookup", "layerskip"]
POLICIES = list(range(1, 9)) + ["auto", "auto-cheap"]
TARGETS = {}


def policy(k, drafter=None):
    """'auto': the per-token policy with the drafter's own cost estimate; 'auto-cheap':
    a draft step costing 5 % of a target step, so rounds run long and stop by confidence."""
    kinds = dict(lookup=getattr(drafter, "proposes_lookup", False), model=getattr(drafter, "uses_draft_model", True))
    if k == "auto":
        return PerToken(assumed(getattr(drafter, "relative_cost", 0.3)), 8, **kinds)
    if k == "auto-cheap":
        return PerToken(assumed(0.05), 8, **kinds)
    return FixedK(k)


def setup(kind, arch, which=0, prompt=None):
    """(target, drafter, prompt) for a drafter kind: the model drafter drafts for the
    random target; lookup and layer skip get targets where they find something
    (see drafter_models), lookup a prompt that quotes the target's continuation."""
    if kind in ("model", "subset"):
        target, drafts = models(arch)
        return target, drafter_models.make(kind, target, drafts[which]), prompt
    if kind == "hybrid":
        if (kind, arch) not in TARGETS:
            target = drafter_models.lookup_target(arch)
            TARGETS[kind, arch] = target, tiny_models.perturbed(target, tiny_models.config_for(arch), 0.01, seed=3)
        target, draft = TARGETS[kind, arch]
        prompt = drafter_models.grounded_prompt(target, prompt) if prompt is not None else None
        return target, drafter_models.make(kind, target, draft), prompt
    if (kind, arch) not in TARGETS:
        build = drafter_models.lookup_target if kind == "lookup" else drafter_models.layerskip_target
        TARGETS[kind, arch] = build(arch)
    target = TARGETS[kind, arch]
    if kind == "lookup" and prompt is not None:
        prompt = drafter_models.grounded_prompt(target, prompt)
    return target, drafter_models.make(kind, target), prompt


def plain(target, prompt):
    h = list(prompt)
    return [t for t, _ in SpeculativeDecoder(target).generate(h, max_tokens=MAX_TOKENS)]


def top2_gap(target, tokens):
    logits = target(mx.array(tokens)[None])[0, -1]
    top = mx.sort(logits)[-2:]
    return (top[1] - top[0]).item()


def assert_same_or_near_tie(target, prompt, expected, got):
    for j, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            gap = top2_gap(target, list(prompt) + expected[:j])
            assert gap < NEAR_TIE, f"diverged at {j}: plain {a} vs speculative {b}, top-2 gap {gap}"
            return
    assert len(expected) == len(got)


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(5, 299), min_size=1, max_size=20),
    k=st.sampled_from(POLICIES),
    which=st.integers(0, 1),
)
def test_greedy_speculative_equals_plain(kind, arch, prompt, k, which):
    target, drafter, prompt = setup(kind, arch, which, prompt)
    expected = plain(target, prompt)
    h = list(prompt)
    dec = SpeculativeDecoder(target, drafter, policy(k, drafter))
    got = [t for t, _ in dec.generate(h, max_tokens=MAX_TOKENS)]
    assert_same_or_near_tie(target, prompt, expected, got)
    assert h == list(prompt) + got


@pytest.mark.parametrize("kind", DRAFTERS)
def test_every_policy_on_both_archs_with_a_fixed_prompt(kind):
    """Every k and the adaptive policies, for each drafter; and the drafter really
    contributes (drafts are kept and drafts are rejected), so both paths are tested."""
    accepted = rejected = 0
    for arch in ("llama", "qwen2"):
        for k in POLICIES:
            target, drafter, prompt = setup(kind, arch, 0, [7, 19, 200, 31, 31, 5])
            expected = plain(target, prompt)
            stats = GenerationStats()
            got = [t for t, _ in SpeculativeDecoder(target, drafter, policy(k, drafter)).generate(
                list(prompt), max_tokens=MAX_TOKENS, stats=stats)]
            assert_same_or_near_tie(target, prompt, expected, got)
            assert stats.tokens_plain + stats.tokens_speculative == len(got)
            accepted += stats.draft_accepted
            rejected += stats.draft_proposed - stats.draft_accepted
    assert accepted > 20 and rejected > 20, (accepted, rejected)


def test_a_wrong_draft_still_gives_the_target_output():
    """A draft from a different random model (near-zero acceptance) cannot change the output."""
    target, _ = models("llama")
    other = tiny_models.make_model("llama", seed=99)
    prompt = [9, 8, 7]
    got = [t for t, _ in SpeculativeDecoder(target, ModelDrafter(other), FixedK(5)).generate(list(prompt), max_tokens=MAX_TOKENS)]
    assert got == plain(target, prompt)
