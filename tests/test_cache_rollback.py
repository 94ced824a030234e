"""After any accept/reject pattern, both KV caches equal a fresh prefill of the
kept tokens (and hold exactly those tokens): for the draft model, and for the
layer-skip draft (its own cache list over the target's shared weights)."""

import mlx.core as mx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drafter_models
import tiny_models
from mlxspec.core.cache import ModelState
from mlxspec.costs.draft_length import FixedK
from mlxspec.drafting.drafters import LayerSkipDrafter, ModelDrafter
from mlxspec.core.sampling import SamplingParams
from mlxspec.decoder import SpeculativeDecoder

CFG = tiny_models.config_for("qwen2")
TARGET = tiny_models.build(CFG, seed=21, scale=3.0)
DRAFTS = {n: tiny_models.perturbed(TARGET, CFG, noise=n, seed=2) for n in (0.0, 0.01, 0.05)}


def assert_cache_is_fresh_prefill(state: ModelState, history):
    kept = history[:-1]
    assert state.tokens == kept
    fresh = ModelState(state.model)
    fresh.forward(kept)
    mx.eval([c.state for c in fresh.cache])
    for got, want in zip(state.cache, fresh.cache):
        assert got.offset == want.offset == len(kept)
        for a, b in zip((got.keys, got.values), (want.keys, want.values)):
            a, b = np.array(a[..., : len(kept), :]), np.array(b[..., : len(kept), :])
            np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(5, 299), min_size=1, max_size=12),
    k=st.integers(1, 6),
    noise=st.sampled_from([0.0, 0.01, 0.05]),
    max_tokens=st.integers(1, 14),
    temp=st.sampled_from([0.0, 1.0]),
)
def test_caches_match_fresh_prefill(prompt, k, noise, max_tokens, temp):
    drafter = ModelDrafter(DRAFTS[noise])
    dec = SpeculativeDecoder(TARGET, drafter, FixedK(k))
    history = list(prompt)
    list(dec.generate(history, SamplingParams(temp=temp, seed=1), max_tokens=max_tokens))
    drafter.prefill(history)  # the drafter rolls back and catches up lazily, at its next proposal
    assert_cache_is_fresh_prefill(dec.target, history)
    assert_cache_is_fresh_prefill(drafter.state, history)


SKIP_TARGET = drafter_models.layerskip_target("qwen2", seed=21)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(5, 299), min_size=1, max_size=12),
    k=st.integers(1, 6),
    keep=st.sampled_from([[0, 2], [1, 2], [0], [0, 1, 2]]),
    max_tokens=st.integers(1, 14),
    temp=st.sampled_from([0.0, 1.0]),
)
def test_layerskip_caches_match_fresh_prefill(prompt, k, keep, max_tokens, temp):
    """Kept layers hold the draft's keys/values, skipped ones 1-wide dummies; all of
    them equal a fresh prefill of the kept tokens, and the target's cache is untouched
    by the draft sharing its weights."""
    drafter = LayerSkipDrafter(SKIP_TARGET, keep=keep)
    dec = SpeculativeDecoder(SKIP_TARGET, drafter, FixedK(k))
    history = list(prompt)
    list(dec.generate(history, SamplingParams(temp=temp, seed=1), max_tokens=max_tokens))
    drafter.prefill(history)
    assert_cache_is_fresh_prefill(dec.target, history)
    assert_cache_is_fresh_prefill(drafter.state, history)


def test_all_accepted_round_feeds_the_drafts_last_token():
    """With draft == target every draft is kept; the draft model has not yet seen its
    own last token, which must be fed first in the next round."""
    drafter = ModelDrafter(DRAFTS[0.0])
    dec = SpeculativeDecoder(TARGET, drafter, FixedK(3))
    history = [7, 8, 9]
    from mlxspec.core.stats import GenerationStats

    stats = GenerationStats()
    list(dec.generate(history, max_tokens=12, stats=stats))
    assert stats.acceptance_rate == 1.0 and stats.target_passes == 3
    assert len(drafter.state.tokens) < len(history) - 1  # it lags behind...
    drafter.prefill(history)
    assert_cache_is_fresh_prefill(drafter.state, history)  # ...and catches up exactly


def test_stopping_mid_round_leaves_consistent_caches():
    """Closing the stream after one token (as Ctrl-C or a stop string does) trims the
    target cache to the tokens actually emitted."""
    dec = SpeculativeDecoder(TARGET, ModelDrafter(DRAFTS[0.0]), FixedK(5))
    history = [10, 11]
    gen = dec.generate(history, max_tokens=50)
    next(gen)
    gen.close()
    assert len(history) == 3
    assert_cache_is_fresh_prefill(dec.target, history)


def test_cancel_during_a_long_prefill():
    """A cancel flag set before generation stops the prompt prefill at the next chunk."""
    from mlxspec.core import cache

    dec = SpeculativeDecoder(TARGET, ModelDrafter(DRAFTS[0.01]), FixedK(3))
    history = [5 + i % 290 for i in range(3 * cache.PREFILL_STEP)]
    out = list(dec.generate(history, max_tokens=5, should_stop=lambda: True))
    assert out == [] and dec.target.positions == 0


def test_positions_fed_without_bookkeeping_are_dropped():
    """An exception between a draft step's forward and its bookkeeping (Ctrl-C)
    leaves extra cache positions; the next sync drops them."""
    drafter = ModelDrafter(DRAFTS[0.01])
    history = [3, 4, 5, 6]
    drafter.prefill(history)
    state = drafter.state
    state.model(mx.array([[7, 8]]), cache=state.cache)  # fed, never recorded
    drafter.prefill(history)
    assert_cache_is_fresh_prefill(state, history)
