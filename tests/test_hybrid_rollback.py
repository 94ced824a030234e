"""After any accept/reject pattern, the recurrent states (conv and SSM / delta-net
arrays) and the KV caches of hybrid and state-space models equal a fresh prefill
of the tokens they claim to hold -- for the target and for a hybrid draft model
-- and once caught up, a fresh prefill of the whole history; an interrupted
draft step is rolled back; checkpoints stay few; the control (state not
restored) fails the same comparison."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiny_hybrid
from mlxspec.core.cache import ModelState, check_rollback
from mlxspec.costs.draft_length import FixedK
from mlxspec.drafting.drafters import ModelDrafter, PromptLookupDrafter
from mlxspec.errors import MlxspecError
from mlxspec.core.recurrent import MAX_ANCHORS, is_recurrent, leaves, state_arrays
from mlxspec.core.sampling import SamplingParams
from mlxspec.decoder import SpeculativeDecoder
from test_hybrid_equality import break_rollback

PAIRS = tiny_hybrid.pairs()


def close(got, want):
    got, want = np.array(got), np.array(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))


def assert_state_is_fresh_prefill(state: ModelState, kept):
    assert state.tokens == kept and state.fed == len(kept)
    fresh = ModelState(state.model)
    if kept:
        fresh.forward(kept)
    mx.eval(state_arrays(fresh.cache), state_arrays(state.cache))
    n_recurrent = 0
    for got, want in zip(leaves(state.cache), leaves(fresh.cache)):
        if is_recurrent(got):
            n_recurrent += 1
            for a, b in zip(got.cache, want.cache):
                assert (a is None) == (b is None)
                if b is not None:
                    close(a, b)
        else:
            assert got.offset == want.offset == len(kept)
            if kept:
                for a, b in ((got.keys, want.keys), (got.values, want.values)):
                    close(a[..., : len(kept), :], b[..., : len(kept), :])
    assert n_recurrent or not any(is_recurrent(c) for c in leaves(state.cache))


def check_after_generation(dec, drafter, history):
    """Where each state stands (possibly a checkpoint before the end), then caught up."""
    assert_state_is_fresh_prefill(dec.target, dec.target.tokens)
    assert dec.target.tokens == history[: len(dec.target.tokens)]
    dec.target.prefill(history)
    assert_state_is_fresh_prefill(dec.target, history[:-1])
    state = getattr(drafter, "state", None)
    if state is not None:
        drafter.prefill(history)
        assert_state_is_fresh_prefill(state, history[:-1])


@pytest.mark.parametrize("name", sorted(PAIRS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(5, 299), min_size=1, max_size=12),
    k=st.integers(1, 8),
    max_tokens=st.integers(1, 16),
    temp=st.sampled_from([0.0, 1.0]),
)
def test_states_match_fresh_prefill(name, prompt, k, max_tokens, temp):
    target, draft = PAIRS[name]
    drafter = ModelDrafter(draft) if draft is not None else PromptLookupDrafter(max_ngram=3, min_ngram=1)
    dec = SpeculativeDecoder(target, drafter, FixedK(k))
    history = list(prompt) + list(prompt)  # something for lookup to find
    list(dec.generate(history, SamplingParams(temp=temp, seed=1), max_tokens=max_tokens))
    check_after_generation(dec, drafter, history)


def fingerprint(state: ModelState):
    """Everything a sync may change: bookkeeping, checkpoints, and each layer's arrays (by identity) and offsets."""
    layers = [(tuple(map(id, c.cache)),) if is_recurrent(c) else
              (id(c.keys), id(c.values), c.offset, getattr(c, "_idx", None)) for c in leaves(state.cache)]
    points = [(p, tuple(map(id, states)), anchor) for p, states, anchor in state.checkpoints.points]
    return list(state.tokens), state.fed, state.known, state.refed, state.positions, points, layers


def synced(state: ModelState, history):
    """`state.sync(history)`, first checking that `pending_count` foresees its length and changes nothing."""
    before = fingerprint(state)
    count = state.pending_count(history)
    assert fingerprint(state) == before
    pending = state.sync(history)
    assert count == len(pending)
    return pending


def random_rollbacks(arch, broken=False):
    model = PAIRS[{"qwen3_5": "qwen3_5+qwen2", "mamba2": "mamba2+qwen3_5", "lfm2": "lfm2+lfm2"}[arch]][0]
    rng = np.random.default_rng(0)
    state, history = ModelState(model), [int(x) for x in rng.integers(5, 300, 6)]
    if broken:
        break_rollback(state)
    for _ in range(25):
        pending = synced(state, history)
        extra = [int(x) for x in rng.integers(5, 300, rng.integers(0, 6))]
        if rng.random() < 0.5:
            state.forward(pending + extra)
        else:
            for t in pending + extra:
                state.forward([t])
        fed = history + extra
        cut = int(rng.integers(1, len(fed) + 1)) if rng.random() < 0.2 else int(rng.integers(len(history), len(fed) + 1))
        history = fed[:cut] + [int(rng.integers(5, 300))]
        pending = synced(state, history)
        assert history[: len(history) - len(pending)] == state.tokens
        assert_state_is_fresh_prefill(state, state.tokens)
        assert len(state.checkpoints.points) <= 1 + MAX_ANCHORS
    state.prefill(history)
    assert_state_is_fresh_prefill(state, history[:-1])


@pytest.mark.parametrize("arch", tiny_hybrid.HYBRIDS)
def test_random_rollbacks_of_a_model_state(arch):
    """Direct sync/forward sequences with random widths and rollback points (the
    verify pass's pattern, a draft's one-token steps, and going back far); before
    each sync, `pending_count` says how many positions it will leave to feed."""
    random_rollbacks(arch)


@pytest.mark.parametrize("arch", tiny_hybrid.HYBRIDS)
def test_the_control_fails_the_comparison(arch):
    """State not restored: the recurrent arrays no longer match a fresh prefill."""
    with pytest.raises(AssertionError):
        random_rollbacks(arch, broken=True)


def test_an_interrupted_draft_step_is_rolled_back():
    """A draft step's forward ran (lazy ids, recorded only after evaluation) and then
    Ctrl-C: the next sync drops what the token list does not name."""
    for name in ("mamba2+qwen3_5", "qwen3_5+qwen2"):
        drafter = ModelDrafter(PAIRS[name][0])
        history = [3, 4, 5, 6]
        drafter.prefill(history)
        drafter.state.forward(mx.array([6, 7], dtype=mx.uint32))  # fed, never recorded
        assert synced(drafter.state, history) == history[-1:]  # foreseen by pending_count too
        drafter.prefill(history)
        assert_state_is_fresh_prefill(drafter.state, history[:-1])


def test_prefill_keeps_one_checkpoint_per_prompt(monkeypatch):
    """A long prompt fed in chunks leaves one state, not one per chunk."""
    from mlxspec.core import cache

    monkeypatch.setattr(cache, "PREFILL_STEP", 4)
    state = ModelState(PAIRS["qwen3_5+qwen2"][0])
    history = list(range(5, 40))
    state.prefill(history)
    assert [p[0] for p in state.checkpoints.points] == [len(history) - 1]
    assert_state_is_fresh_prefill(state, history[:-1])


def test_an_edited_history_goes_back_to_an_anchor_or_the_start():
    state = ModelState(PAIRS["lfm2+lfm2"][0])
    first = [5, 6, 7, 8, 9, 10]
    state.prefill(first)
    state.forward([10, 11, 12])
    edited = first[:3] + [50, 51]  # before the prefill's end: back to the start
    assert state.sync(edited) == edited and state.tokens == []
    state.prefill(edited)
    assert_state_is_fresh_prefill(state, edited[:-1])


def test_models_that_cannot_roll_back_are_refused():
    """DeepSeek-V4's layer cache (a window plus compressed groups) neither trims
    nor is a plain array state: refused in one line, naming it."""
    import tiny_models

    cfg = dict(model_type="deepseek_v41", vocab_size=300, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, head_dim=16, q_lora_rank=16, qk_rope_head_dim=8, o_groups=1, o_lora_rank=16,
               moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, sliding_window=8,
               compress_ratios=(1, 1), index_n_heads=2, index_head_dim=8, index_topk=4, hc_mult=1)
    with pytest.raises(MlxspecError, match="LayerCache") as e:
        check_rollback(tiny_models.build(cfg), "target")
    assert "\n" not in str(e.value)
    for arch in tiny_hybrid.CONFIGS:
        check_rollback(tiny_hybrid.build(arch))


@pytest.mark.parametrize("limit", [0, 3])
def test_refed_positions_stay_bounded_over_rejected_rounds(limit):
    """Round after round rejected at the first draft: the re-fed run grows by one a
    round while it rides along (up to `merge_limit`), then gets a call of its own and
    a checkpoint after it, so it never keeps growing; states stay exact throughout."""
    state = ModelState(PAIRS["qwen3_5+qwen2"][0])
    state.merge_limit = limit
    history = [5, 6, 7, 8]
    increments = []
    for r in range(12):
        before = state.refed
        pending = state.sync(history)
        increments.append(state.refed - before)
        assert_state_is_fresh_prefill(state, state.tokens)
        state.forward(pending + [100 + r, 101 + r, 102 + r])
        history = history + [200 + r]  # the first draft rejected: the target's own token
    assert max(increments) == limit + 1 and min(increments[1:]) >= 1
