"""Greedy speculation on hybrid and state-space targets (qwen3_5: gated delta-net +
attention; mamba2: recurrent only; lfm2: short convolutions + attention) gives
the target's own greedy output, with an attention-only draft, a hybrid draft and
prompt lookup, for k = 1..8 and the per-token policy; rollbacks of recurrent
state really happen (re-fed positions); and a rollback that does not restore
the recurrent state (the control) is caught by the same checks."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drafter_models
import tiny_hybrid
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import ModelDrafter, PromptLookupDrafter
from mlxspec.core.recurrent import Checkpoints
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from test_greedy_equality import MAX_TOKENS, assert_same_or_near_tie, plain

PAIRS = tiny_hybrid.pairs()


def setup(name, prompt):
    target, draft = PAIRS[name]
    if draft is None:
        return target, PromptLookupDrafter(max_ngram=3, min_ngram=1), drafter_models.grounded_prompt(target, prompt)
    return target, ModelDrafter(draft), prompt


def policy(k, drafter):
    if k == "auto":  # drafting cheap, so rounds run long and stop by confidence
        return PerToken(assumed(0.05), 8, lookup=not drafter.uses_draft_model, model=drafter.uses_draft_model)
    return FixedK(k)


def run(target, drafter, prompt, k, stats=None):
    dec = SpeculativeDecoder(target, drafter, policy(k, drafter))
    h = list(prompt)
    got = [t for t, _ in dec.generate(h, max_tokens=MAX_TOKENS, stats=stats)]
    assert h == list(prompt) + got
    return got, dec


@pytest.mark.parametrize("name", sorted(PAIRS))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(5, 299), min_size=1, max_size=16),
    k=st.sampled_from(list(range(1, 9)) + ["auto"]),
)
def test_greedy_speculative_equals_plain(name, prompt, k):
    target, drafter, prompt = setup(name, prompt)
    got, _ = run(target, drafter, prompt, k)
    assert_same_or_near_tie(target, prompt, plain(target, prompt), got)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_k_with_a_fixed_prompt_exercises_rollbacks(name):
    """k = 1..8: the output is the target's, drafts are kept and rejected, and the
    target re-feeds positions after its recurrent layers roll back."""
    accepted = rejected = refed = 0
    for k in range(1, 9):
        target, drafter, prompt = setup(name, [7, 19, 200, 31, 31, 5])
        stats = GenerationStats()
        got, dec = run(target, drafter, prompt, k, stats)
        assert_same_or_near_tie(target, prompt, plain(target, prompt), got)
        accepted += stats.draft_accepted
        rejected += stats.draft_proposed - stats.draft_accepted
        refed += dec.target.refed
        assert stats.refed_positions == dec.target.refed
    assert accepted > 10 and rejected > 10 and refed > 10, (accepted, rejected, refed)


class NotRestored(Checkpoints):
    """The control: a rollback that forgets to restore the recurrent state (it
    trims attention layers and re-feeds, but the recurrent layers keep the
    rejected tokens folded in)."""

    def restore(self, keep):
        self.drop_after(keep)
        pos = self.points[-1][0] if self.points else 0
        self.prune()
        return pos


def break_rollback(state):
    state.checkpoints.__class__ = NotRestored


@pytest.mark.parametrize("name", ["qwen3_5+qwen2", "mamba2+qwen3_5", "lfm2+lfm2", "lfm2+lookup"])
def test_a_rollback_that_does_not_restore_the_state_is_caught(name):
    diverged = 0
    for k in range(1, 9):
        for start in ([7, 19, 200, 31, 31, 5], [40, 41, 42]):
            target, drafter, prompt = setup(name, start)
            dec = SpeculativeDecoder(target, drafter, FixedK(k))
            break_rollback(dec.target)
            got = [t for t, _ in dec.generate(list(prompt), max_tokens=MAX_TOKENS)]
            diverged += got != plain(target, prompt)
    assert diverged >= 4, diverged


@pytest.mark.parametrize("name,keep", [("qwen3_5+qwen2", [1, 2, 3]), ("lfm2+lfm2", [0, 1, 3]), ("lfm2+lfm2", [0, 2])])
def test_layer_skip_on_a_hybrid_target(name, keep):
    """Self-speculation with recurrent layers skipped (their state stays empty) or kept."""
    from mlxspec.drafting.drafters import LayerSkipDrafter
    from test_hybrid_rollback import assert_state_is_fresh_prefill

    target = PAIRS[name][0]
    for k in (1, 3, 6):
        drafter = LayerSkipDrafter(target, keep=keep)
        prompt = [7, 19, 200, 31, 31, 5]
        got, dec = run(target, drafter, prompt, k)
        assert_same_or_near_tie(target, prompt, plain(target, prompt), got)
        history = prompt + got
        drafter.prefill(history)
        assert_state_is_fresh_prefill(drafter.state, history[:-1])


def test_sliding_window_past_its_window():
    """gemma3's sliding-window layers (RotatingKVCache, a 4-token window here) cannot
    be trimmed once the window wraps; their checkpoints make rollbacks exact there
    (before, the whole trim was skipped and speculation diverged from plain)."""
    import tiny_models

    cfg = {**tiny_models.config_for("gemma3_text"), "head_dim": 16, "query_pre_attn_scalar": 16,
           "sliding_window": 4, "sliding_window_pattern": 2}
    target = tiny_models.build(cfg, seed=11, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.03, seed=5)
    accepted = rejected = 0
    for k in range(1, 7):
        for prompt in ([5, 6, 7], [9, 10, 11, 12, 13, 14]):
            stats = GenerationStats()
            got, _ = run(target, ModelDrafter(draft), prompt, k, stats)
            assert_same_or_near_tie(target, prompt, plain(target, prompt), got)
            accepted += stats.draft_accepted
            rejected += stats.draft_proposed - stats.draft_accepted
    assert accepted > 10 and rejected > 10, (accepted, rejected)
