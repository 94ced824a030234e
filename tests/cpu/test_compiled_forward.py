"""Compiled draft forwards (mlxspec/cpu/compiled_forward.py): a compiled call computes
what the model's own call computes (to float32 rounding) through chain steps,
rollbacks, cache growth and tree blocks; positions left behind by a rollback are
never read; the draft of a loaded pair uses it and speculative decoding stays
equal to plain decoding and sampled sequences follow the target's exact
distribution (chi-square, with a broken control); it is off where it cannot run."""

import mlx.core as mx
import numpy as np
import pytest

import mlxspec
import tiny_models
from mlxspec import api
from mlxspec.arch import surgery
from mlxspec.cpu import compiled_forward
from mlxspec.core.cache import ModelState
from mlxspec.cpu.compiled_forward import CompiledForward
from mlxspec.trees.attention import TreeBlock
from test_layers import ARCHS, lean_model

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture
def calls(monkeypatch):
    """How many compiled calls ran."""
    count = {"n": 0}
    original = CompiledForward.__call__

    def counted(self, *args):
        count["n"] += 1
        return original(self, *args)

    monkeypatch.setattr(CompiledForward, "__call__", counted)
    return count


def _pair_of_states(model):
    plain, fast = ModelState(model), ModelState(model)
    assert compiled_forward.attach(fast) and plain.compiled is None
    return plain, fast


def _prefilled(arch, seed, length):
    """Two states of one lean model, uncompiled and compiled, prefilled with the same
    random history; the generator that drew it."""
    plain, fast = _pair_of_states(lean_model(arch))
    rng = np.random.default_rng(seed)
    history = [int(t) for t in rng.integers(3, 64, length)]
    for s in (plain, fast):
        s.prefill(history)
    return plain, fast, rng, history


def _same(a, b):
    mx.eval(a, b)
    np.testing.assert_allclose(np.array(a), np.array(b), **TOL)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_chain_steps_rollbacks_and_growth_match_the_models_call(arch, calls):
    plain, fast, rng, history = _prefilled(arch, 0, 240)
    while len(history) < 300:  # crosses the caches' first 256-position allocation
        width = int(rng.integers(1, 6))
        new = [int(t) for t in rng.integers(3, 64, width)]
        _same(plain.forward(plain.sync(history) + new), fast.forward(fast.sync(history) + new))
        keep = int(rng.integers(0, width + 1))  # a rejected draft: the rest is rolled back
        history = history + new[:keep] + [int(rng.integers(3, 64))]
    assert fast.cache[0].keys.shape[2] > 256 and calls["n"] > 10
    assert fast.cache[0].offset == plain.cache[0].offset


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tree_blocks_match_the_models_tree_call(arch, calls):
    plain, fast, rng, history = _prefilled(arch, 1, 20)
    for _ in range(4):
        pending = [s.sync(history) for s in (plain, fast)][0]
        assert pending == history[-1:]
        blocks = [TreeBlock(s) for s in (plain, fast)]
        parents = [-1, 0, 1, 1, 2, 3, 3]  # the pending token, then branches: the tree path
        tokens = pending + [int(t) for t in rng.integers(3, 64, len(parents) - 1)]
        _same(*[b.forward(tokens, parents) for b in blocks])
        more = [int(t) for t in rng.integers(3, 64, 2)]
        _same(*[b.forward(more, [5, 6]) for b in blocks])  # a second level under nodes 5 and 6
        path = [0, 1, 3, 5, 7]
        for b in blocks:
            b.commit(path)
        history = history + [tokens[1], tokens[3], tokens[5], more[0]]
        assert fast.tokens == plain.tokens == history
    assert calls["n"] >= 8


def test_positions_left_by_a_rollback_are_never_read():
    model = lean_model("qwen2")
    plain, fast = _pair_of_states(model)
    history = list(range(3, 40))
    for s in (plain, fast):
        s.prefill(history)
        s.forward(s.sync(history) + [5, 6, 7, 8])  # drafts, then rejected
        s.sync(history)
    for c in fast.cache:  # what a rollback leaves behind the offset: poison it
        c.keys[..., c.offset:, :] = 1e4
        c.values[..., c.offset:, :] = 1e4
    _same(plain.forward(plain.sync(history) + [9]), fast.forward(fast.sync(history) + [9]))


def test_a_new_model_object_is_traced_again():
    """A pruned head widened by a conversation is a new view of the draft: its
    compiled call must use that view, not the first one traced."""
    first, second = lean_model("llama", seed=3), lean_model("llama", seed=4)
    state = ModelState(first)
    compiled_forward.attach(state)
    state.prefill([3, 4, 5, 6])
    state.forward(state.sync([3, 4, 5, 6]))
    state.model = second
    state.reset()
    reference = ModelState(second)
    for s in (state, reference):
        s.prefill([3, 4, 5, 6])
    _same(reference.forward(reference.sync([3, 4, 5, 6])), state.forward(state.sync([3, 4, 5, 6])))


def test_off_where_it_cannot_run(monkeypatch):
    lean = lean_model("qwen2")
    assert compiled_forward.unusable(ModelState(lean)) is None
    assert "lean layers are off" in compiled_forward.unusable(ModelState(tiny_models.make_model("qwen2")))
    assert "bounded" in compiled_forward.unusable(ModelState(lean, max_kv_size=64))
    monkeypatch.setenv(compiled_forward.ENV, "0")
    state = ModelState(lean)
    assert not compiled_forward.attach(state) and state.compiled is None


def test_the_draft_of_a_loaded_pair_is_compiled_and_output_equals_plain(tmp_path, calls):
    pair = mlxspec.load(tiny_models.f16_model_dir(tmp_path / "t", "qwen2"),
                        tiny_models.f16_model_dir(tmp_path / "d", "qwen2", noise=0.01, seed=1))
    assert api.make_decoder(pair).drafter.state.compiled is not None
    assert api.make_decoder(pair).target.compiled is None  # the target is never compiled
    for prompt in ("w1 w2 w3", "w7 w7 w7 w7 w9"):
        plain = mlxspec.generate(pair, prompt, drafter="none", max_tokens=24, chat_template=False).tokens
        for tree in (True, False):
            spec = mlxspec.generate(pair, prompt, max_tokens=24, chat_template=False, tree=tree, num_draft=3)
            assert spec.tokens == plain and spec.stats.draft_accepted > 0
    assert calls["n"] > 0


def test_a_calibration_belongs_to_compiled_or_uncompiled_draft_steps(tiny_pair_dirs, monkeypatch):
    from mlxspec.costs import calibration as calibration_cache
    from mlxspec.drafting.drafters import ModelDrafter

    pair = mlxspec.load(*tiny_pair_dirs)
    key = calibration_cache.cache_key(pair, ModelDrafter(pair.draft))
    monkeypatch.setenv(compiled_forward.ENV, "0")
    assert key is not None and calibration_cache.cache_key(pair, ModelDrafter(pair.draft)) != key


def test_a_growing_cache_keeps_the_functions_of_its_last_capacities_only(monkeypatch):
    monkeypatch.setattr(compiled_forward, "KEPT", 2)
    model = lean_model("llama")
    plain, fast = _pair_of_states(model)
    history = [3 + i % 50 for i in range(200)]
    for s in (plain, fast):
        s.prefill(history)
    capacities = []
    while len(history) < 800:  # 256, 512, 768, 1024 positions allocated in turn
        history = history + [5, 6, 7]
        _same(plain.forward(plain.sync(history)), fast.forward(fast.sync(history)))
        capacities.append(fast.cache[0].keys.shape[2])
    assert sorted(set(capacities)) == [256, 512, 768, 1024]
    assert [key[1] for key in compiled_forward._functions] == [768, 1024]


def _function_of(state):
    from mlxspec.cpu import blas_layout

    return compiled_forward._functions[compiled_forward._identity(state.model), 256, surgery.module_changes][1]


def test_states_of_one_model_and_its_equal_views_share_a_function():
    from mlxspec.arch.surgery import View

    model = lean_model("qwen2")
    states = [ModelState(model), ModelState(View(model)), ModelState(View(model, lm_head=model.lm_head)),
              ModelState(View(model, lm_head=lean_model("qwen2", seed=5).lm_head))]
    used = []
    for s in states:
        compiled_forward.attach(s)
        s.prefill([3, 4, 5])
        s.forward(s.sync([3, 4, 5]))
        used.append(_function_of(s))
    assert used[0] is used[1]  # a view that overrides nothing computes what its model does
    assert used[1] is not used[2] and used[2] is not used[3]  # a head of its own: a function of its own
    again = ModelState(states[2].model)
    compiled_forward.attach(again)
    again.prefill([3, 4, 5])
    again.forward(again.sync([3, 4, 5]))
    assert _function_of(again) is used[2]
    same_rows = ModelState(View(model, lm_head=model.lm_head))  # another view with the same rows: traced once
    compiled_forward.attach(same_rows)
    same_rows.prefill([3, 4, 5])
    same_rows.forward(same_rows.sync([3, 4, 5]))
    assert _function_of(same_rows) is used[2]


def test_a_module_put_in_place_is_used_by_the_next_compiled_call():
    """Benchmarks swap a loaded draft's layers (int8 against 16-bit): a trace made
    before the swap must not be replayed after it."""
    from mlxspec.cpu.blas_layout import put_module

    plain, fast, _, history = _prefilled("qwen2", 2, 12)
    _same(plain.forward(plain.sync(history)), fast.forward(fast.sync(history)))
    model = plain.model
    put_module(model, "model.layers.0.mlp", lean_model("qwen2", seed=6).model.layers[0].mlp)
    history = history + [7]
    _same(plain.forward(plain.sync(history)), fast.forward(fast.sync(history)))


def _compiled_draft_samples(broken_residual, monkeypatch, calls):
    """Sequence-level samples (test_sequence_distribution's setting) with a lean,
    compiled draft; the chi-square p-value against the target's exact probabilities."""
    from mlxspec.core import acceptance
    from mlxspec.cpu import layers as lean_ops
    from mlxspec.drafting.drafters import ModelDrafter
    from stats_util import chi_square
    from test_sequence_distribution import PARAMS, RESIDUAL_SAMPLES, V, exact_sequence_probs, sample_sequences

    cfg = tiny_models.config_for("llama", vocab_size=V, hidden=32, ffn=64)
    target, draft = tiny_models.build(cfg, seed=3, scale=1.5), tiny_models.build(cfg, seed=4, scale=1.5)
    lean_ops.prepare(draft)
    drafter = ModelDrafter(draft)
    assert drafter.state.compiled is not None
    probs = exact_sequence_probs(target, PARAMS)
    if broken_residual:
        monkeypatch.setattr(acceptance, "residual", lambda p, q, draft: p)
    # the broken residual's count in test_sequence_distribution: p ~ 4e-8 here (threshold 1e-3; 4e-13 at
    # 1000); the sound case passes at p = 0.71
    counts, accepted = sample_sequences(target, drafter, PARAMS, samples=RESIDUAL_SAMPLES)
    assert accepted > RESIDUAL_SAMPLES // 4 and calls["n"] > 0
    return chi_square(counts, probs, RESIDUAL_SAMPLES)[2]


def test_samples_with_a_compiled_draft_follow_the_targets_sequence_distribution(monkeypatch, calls):
    assert _compiled_draft_samples(False, monkeypatch, calls) > 1e-3


def test_the_same_chi_square_fails_with_a_broken_residual(monkeypatch, calls):
    assert _compiled_draft_samples(True, monkeypatch, calls) < 1e-3
