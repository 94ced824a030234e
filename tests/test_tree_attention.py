"""Tree attention on mlx-lm's own model classes: the logits of every node of a
tree block equal those of a plain chain forward of its root-to-node path, and a
committed path leaves the KV cache equal to a fresh prefill of the kept tokens."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tiny_models
from mlxspec.core.cache import ModelState
from mlxspec.trees.attention import TREE_MODEL_TYPES, TreeBlock, tree_support

ARCHS = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 16}}
_MODELS = {}


def model_for(arch):
    if arch not in _MODELS:
        cfg = tiny_models.config_for(arch, vocab_size=64)
        cfg.update(ARCHS[arch])
        _MODELS[arch] = tiny_models.build(cfg, seed=3, scale=3.0)
    return _MODELS[arch]


def chain_logits(model, tokens):
    return model(mx.array(tokens, dtype=mx.uint32)[None])[0]


def random_tree(rng, n):
    """Parents (block indices, -1 = the prefix) of a random n-node tree, parents first."""
    return [int(rng.integers(-1, i)) for i in range(n)]


def path_to(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def test_registry_is_what_the_tests_cover():
    assert set(TREE_MODEL_TYPES) == set(ARCHS)
    for arch in ARCHS:
        assert tree_support(model_for(arch)) is None


def test_unsupported_model_is_named():
    cfg = tiny_models.config_for("llama", vocab_size=64)
    model = tiny_models.build(cfg)
    model.model_type = "made-up"
    assert "made-up" in tree_support(model)


def tree_case(arch, seed, prefix_len, n, levels):
    """A random tree after a random prefix: (model, rng, prefix, tokens, parents, state, block,
    cuts), the tree to be fed over `levels` forwards (cuts), as a draft expands its tree."""
    model = model_for(arch)
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 64, prefix_len).tolist()
    tokens = rng.integers(0, 64, n).tolist()
    parents = random_tree(rng, n)
    state = ModelState(model)
    state.forward(prefix)
    cuts = sorted(set(rng.integers(1, n + 1, levels - 1).tolist()) | {0, n})
    return model, rng, prefix, tokens, parents, state, TreeBlock(state), cuts


@pytest.mark.parametrize("arch", sorted(ARCHS))
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), prefix_len=st.integers(1, 9), n=st.integers(1, 10), levels=st.integers(1, 3))
def test_node_logits_equal_chain_forward(arch, seed, prefix_len, n, levels):
    model, rng, prefix, tokens, parents, state, block, cuts = tree_case(arch, seed, prefix_len, n, levels)
    rows = []
    for a, b in zip(cuts, cuts[1:]):
        rows.append(block.forward(tokens[a:b], parents[a:b]))
    logits = mx.concatenate(rows, axis=0)
    for i in range(n):
        ref = chain_logits(model, prefix + [tokens[j] for j in path_to(parents, i)])[-1]
        np.testing.assert_allclose(np.array(logits[i]), np.array(ref), atol=2e-4, rtol=1e-4)
    # commit a random root-to-node path: the cache equals a fresh prefill of the kept tokens
    path = path_to(parents, int(rng.integers(0, n)))
    block.commit(path)
    kept = prefix + [tokens[j] for j in path]
    assert state.tokens == kept
    fresh = ModelState(model)
    fresh.forward(kept)
    for c, f in zip(state.cache, fresh.cache):
        assert c.offset == f.offset == len(kept)
        k, v = c.keys_and_values() if hasattr(c, "keys_and_values") else c.state[:2]
        fk, fv = f.keys_and_values()
        np.testing.assert_allclose(np.array(k), np.array(fk), atol=2e-4, rtol=1e-4)
        np.testing.assert_allclose(np.array(v), np.array(fv), atol=2e-4, rtol=1e-4)
    # and the next forward continues exactly
    nxt = int(rng.integers(0, 64))
    np.testing.assert_allclose(np.array(state.forward([nxt])[-1]),
                               np.array(chain_logits(model, kept + [nxt])[-1]), atol=2e-4, rtol=1e-4)


def test_abandoned_block_is_dropped_by_sync():
    model = model_for("llama")
    state = ModelState(model)
    state.forward([1, 2, 3])
    TreeBlock(state).forward([4, 5, 6], [-1, -1, 0])
    assert state.sync([1, 2, 3, 7]) == [7]
    np.testing.assert_allclose(np.array(state.forward([7])[-1]), np.array(chain_logits(model, [1, 2, 3, 7])[-1]),
                               atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_chain_shaped_block_takes_the_causal_call_until_it_branches(arch, monkeypatch):
    """While every node is its predecessor's child, the block runs the model's own causal
    call (cheaper); once a node branches off, every later call of the block needs the tree
    mask -- even a call that is a chain itself, since the cache then holds a sibling -- until
    the commit makes the block empty again.  Each node's logits are its path's."""
    model = model_for(arch)
    prefix = [3, 9, 27, 17]
    state = ModelState(model)
    state.forward(prefix)
    block = TreeBlock(state)
    calls = []
    tree_call, causal = TreeBlock._call, TreeBlock._causal
    monkeypatch.setattr(TreeBlock, "_call", lambda self, *a: (calls.append("tree"), tree_call(self, *a))[1])
    monkeypatch.setattr(TreeBlock, "_causal", lambda self, *a: (calls.append("causal"), causal(self, *a))[1])

    def check(logits, paths):
        for row, path in zip(logits, paths):
            ref = chain_logits(model, prefix + path)[-1]
            np.testing.assert_allclose(np.array(row), np.array(ref), atol=2e-4, rtol=1e-4)

    check(block.forward([5, 6], [-1, 0]), [[5], [5, 6]])  # a chain
    check(block.forward([7], [1]), [[5, 6, 7]])  # still one
    check(block.forward([8], [1]), [[5, 6, 8]])  # 8 is 7's sibling
    check(block.forward([9, 10], [3, 4]), [[5, 6, 8, 9], [5, 6, 8, 9, 10]])  # a chain under 8: must not see 7
    assert calls == ["causal", "causal", "tree", "tree"]
    block.commit([0, 1, 3])
    prefix += [5, 6, 8]
    check(block.forward([11], [-1]), [[11]])
    assert calls[-1] == "causal"
