"""Lean layers (mlxspec/cpu/layers.py): RoPE from shared tables and a compiled
RMSNorm compute what mlx-lm's modules compute (to float32 rounding), LeanMLP
exactly what the model's own MLP computes, score each
position the same whatever the call holds (what verify passes and trees rely
on), keep speculative decoding equal to plain decoding, and build fewer MLX
operations per step."""

import os
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxspec
import tiny_models
from mlxspec.cpu import kernel_ops, layers as lean_ops, kernel as small_gemm
from mlxspec.core.cache import ModelState
from mlxspec.cpu.layers import LeanRMSNorm, LeanRope, RopeTables
from mlxspec.trees.attention import TreeBlock
from test_tree_attention import path_to

ARCHS = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 16}}


def lean_model(arch, seed=3):
    cfg = tiny_models.config_for(arch, vocab_size=64)
    cfg.update(ARCHS[arch])
    model = tiny_models.build(cfg, seed=seed, scale=3.0)
    counts = lean_ops.prepare(model)
    assert counts.get("rope") == cfg["num_hidden_layers"] and counts.get("norm", 0) >= 2 * cfg["num_hidden_layers"]
    assert counts.get("mlp", 0) == (cfg["num_hidden_layers"] if small_gemm.loaded() else 0)
    return model


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [16, 8])  # all of a 16-feature head, or half of it (the rest passes through)
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_rope_equals_mlx_rope(traditional, dims, scale):
    rope = nn.RoPE(dims, traditional=traditional, base=10000.0, scale=scale)
    lean = LeanRope(rope, RopeTables(dims, 10000.0, scale, traditional))
    x = mx.random.normal((1, 3, 5, 16), key=mx.random.key(1))
    for offset in (0, 7, 300):
        np.testing.assert_allclose(np.array(lean(x, offset=offset)), np.array(rope(x, offset=offset)), atol=2e-5)
    rows = mx.random.normal((4, 3, 2, 16), key=mx.random.key(2))  # one offset per batch row, as trees call it
    offsets = mx.array([0, 5, 5, 41])
    np.testing.assert_allclose(np.array(lean(rows, offset=offsets)), np.array(rope(rows, offset=offsets)), atol=2e-5)
    half = x.astype(mx.bfloat16)  # not float32: MLX's own RoPE, in that dtype
    assert lean(half, offset=7).dtype == mx.bfloat16
    assert np.array_equal(np.array(lean(half, offset=7).astype(mx.float32)),
                          np.array(rope(half, offset=7).astype(mx.float32)))


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [16, 8])
def test_a_compiled_forwards_partners_are_one_exact_product(traditional, dims):
    """Traced for a compiled forward, LeanRope takes each feature's signed partner by one
    product with a signed permutation (fewer operations to replay): bit for bit what the
    slices, negation and concatenation give, whatever the values."""
    t = RopeTables(dims, 10000.0, 1.0, traditional)
    x = np.random.default_rng(dims).standard_normal((1, 4, 3, 16)).astype(np.float32) * 30
    x[0, 0, 0, :4] = [0.0, 1e-30, -1e38, 3.0e38]
    want = np.array(lean_ops._partners(mx.array(x), dims, traditional))
    got = np.array(mx.array(x) @ t.partner_matrix(16))
    assert np.array_equal(got, want)
    rope = LeanRope(nn.RoPE(dims, traditional=traditional), t)
    x = mx.array(x[..., 1:, :])  # finite rotations: positions 7 and 8
    c, s = t.tables(("at", b"7-8"), np.array([7, 8]), 16)
    with t.giving(c, s):
        given = np.array(rope(x))
    np.testing.assert_allclose(given, np.array(rope(x, offset=7)), rtol=1e-6, atol=1e-5)


def test_rms_norm_equals_mlx_rms_norm():
    norm = nn.RMSNorm(24, eps=1e-5)
    norm.weight = mx.random.normal((24,), key=mx.random.key(3))
    lean = LeanRMSNorm(norm)
    for shape in ((1, 1, 24), (1, 7, 24), (2, 3, 4, 24)):
        x = 5 * mx.random.normal(shape, key=mx.random.key(4))
        np.testing.assert_allclose(np.array(lean(x)), np.array(norm(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_position_scores_the_same_in_any_call(arch):
    """Bit for bit: a chain forward of n tokens gives the logits n one-token steps
    give (a verify pass against plain decoding)."""
    assert _steps_equal_a_chain(lean_model(arch))


def _steps_equal_a_chain(model) -> bool:
    tokens = [3, 9, 27, 17, 51, 40, 2, 8, 33]
    state = ModelState(model)
    state.forward(tokens[:4])
    whole = np.array(state.forward(tokens[4:]))
    steps = ModelState(model)
    steps.forward(tokens[:4])
    one = np.stack([np.array(steps.forward([t])[-1]) for t in tokens[4:]])
    return np.array_equal(whole, one)


def _tree_equals_chains(model, seed):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 64, 5).tolist()
    tokens = rng.integers(0, 64, 8).tolist()
    parents = [int(rng.integers(-1, i)) for i in range(8)]
    state = ModelState(model)
    state.forward(prefix)
    logits = np.array(TreeBlock(state).forward(tokens, parents))
    for i in range(8):
        chain = ModelState(model)
        ref = np.array(chain.forward(prefix + [tokens[j] for j in path_to(parents, i)])[-1])
        if not np.array_equal(logits[i], ref):
            return False
    return True


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tree_nodes_equal_chain_forwards_bit_for_bit(arch):
    model = lean_model(arch)
    assert all(_tree_equals_chains(model, seed) for seed in range(3))


def test_stale_tables_are_caught(monkeypatch):
    """The broken control: tables reused whatever the positions (a memo that ignores
    its key) fail the same check."""
    model = lean_model("qwen2")
    real = RopeTables.tables

    def stale(self, key, positions, d):
        value = self._last[1]
        if value is not None and value[0].shape[0] == len(positions):
            return value
        return real(self, key, positions, d)

    assert _steps_equal_a_chain(model)
    monkeypatch.setattr(RopeTables, "tables", stale)
    assert not _steps_equal_a_chain(model)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_loaded_model_is_lean_and_close_to_mlx_lm(tmp_path, monkeypatch, arch):
    path = tiny_models.f16_model_dir(tmp_path / arch, arch)
    lean = mlxspec.load(path, no_draft=True).target
    monkeypatch.setenv(lean_ops.ENV, "0")
    plain = mlxspec.load(path, no_draft=True).target
    assert lean_ops.applied(lean) and not lean_ops.applied(plain)
    ids = mx.array([[1, 5, 9, 33, 2, 7, 80, 81, 12, 4]])
    np.testing.assert_allclose(np.array(lean(ids)), np.array(plain(ids)), rtol=1e-4, atol=1e-3)


def test_greedy_speculative_equals_plain_on_a_lean_pair(tmp_path):
    pair = mlxspec.load(tiny_models.f16_model_dir(tmp_path / "t", "qwen2"),
                        tiny_models.f16_model_dir(tmp_path / "d", "qwen2", noise=0.01, seed=1))
    assert lean_ops.applied(pair.target) and lean_ops.applied(pair.draft)
    for prompt in ("w1 w2 w3", "w7 w7 w7 w7 w9", "w40 w41"):
        plain = mlxspec.generate(pair, prompt, drafter="none", max_tokens=24, chat_template=False).tokens
        for tree in (True, False):
            spec = mlxspec.generate(pair, prompt, max_tokens=24, chat_template=False, tree=tree, num_draft=3)
            assert spec.tokens == plain and spec.stats.draft_accepted > 0


def _operations(model) -> int:
    state = ModelState(model)
    state.forward([1, 2, 3, 4])
    out = model(mx.array([[5]]), cache=state.cache)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"lean-ops-{os.getpid()}.dot")
    try:
        mx.export_to_dot(path, out)
        with open(path) as f:
            return len(re.findall(r'label ?= ?"[A-Za-z]', f.read()))
    finally:
        os.unlink(path)


def test_a_step_builds_fewer_operations():
    cfg = tiny_models.config_for("qwen2", vocab_size=64)
    before = _operations(tiny_models.build(cfg, seed=3))
    after = _operations(lean_model("qwen2"))
    assert after < 0.75 * before, (before, after)


def test_turned_off_by_environment(tmp_path):
    assert tiny_models.loaded_elsewhere(tmp_path / "llama", {lean_ops.ENV: "0"}, "from mlxspec.cpu import layers as lean_ops",
                                        "lean_ops.wanted(), bool(lean_ops.applied(m))") == ["False", "False"]


kernel_only = pytest.mark.skipif(not small_gemm.loaded(), reason=f"kernel not loaded: {small_gemm.why()}")


@kernel_only
@pytest.mark.parametrize("arch", list(ARCHS))
def test_lean_mlp_equals_the_models_own_mlp(arch):
    cfg = tiny_models.config_for(arch, vocab_size=64, ffn=96)
    cfg.update(ARCHS[arch])
    mlp = tiny_models.build(cfg, seed=5, scale=3.0).layers[0].mlp
    assert type(mlp) in lean_ops._swiglu_mlps() and kernel_ops.usable("swiglu")
    x = mx.array(np.random.default_rng(2).standard_normal((1, 6, cfg["hidden_size"])).astype(np.float32) * 4)
    lean = lean_ops.LeanMLP(mlp)
    assert np.array_equal(np.array(lean(x)), np.array(mlp(x)))
    assert dict(lean.parameters()).keys() == dict(mlp.parameters()).keys()  # same parameter paths
    odd = tiny_models.build({**cfg, "intermediate_size": 40}, seed=5).layers[0].mlp  # not a multiple of 16
    assert np.array_equal(np.array(lean_ops.LeanMLP(odd)(x)), np.array(odd(x)))
