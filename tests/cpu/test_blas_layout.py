"""Weights laid out for BLAS (cpu/blas_layout.py): the model computes what it computed
before, every float32 linear layer is converted (and nothing else), the pruned
draft head works on converted heads, loading converts on the CPU backend, and a
calibration belongs to one layout."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxspec
import tiny_models
from mlxspec import cpu
from mlxspec.cpu import blas_layout, packed_weights
from mlxspec.costs import calibration as calibration_cache
from mlxspec.cpu.blas_layout import TransposedLinear
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.drafting.vocab_subset import SubsetHead


def linears(model):
    return [(p, m) for p, m in model.named_modules() if type(m) is nn.Linear]


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", False), ("qwen2", True)])
def test_prepared_model_gives_the_same_logits(arch, tied):
    cfg = {**tiny_models.config_for(arch), "tie_word_embeddings": tied}
    model = tiny_models.build(cfg, seed=3, scale=2.0)
    x = mx.array([[5, 17, 42, 9, 250]])
    before = np.array(model(x))
    shapes = {p: m.weight.shape for p, m in linears(model)}
    assert shapes
    n = blas_layout.prepare(model)
    assert n == len(shapes)
    assert not linears(model)  # every float32 nn.Linear is now stored (in, out)
    for path, m in model.named_modules():
        if path in shapes:
            assert isinstance(m, TransposedLinear) and m.weight.shape == shapes[path]
            assert m.wt.shape == shapes[path][::-1]
    np.testing.assert_allclose(np.array(model(x)), before, rtol=1e-5, atol=1e-5)
    assert cpu.layout(model) == "blas"


def test_biases_are_kept():
    lin = nn.Linear(8, 5, bias=True)
    lin.bias = mx.arange(5, dtype=mx.float32)
    x = mx.random.normal((3, 8), key=mx.random.key(0))
    t = TransposedLinear(lin)
    np.testing.assert_allclose(np.array(t(x)), np.array(lin(x)), rtol=1e-5, atol=1e-5)


def test_quantised_and_other_dtypes_are_left_alone():
    cfg = tiny_models.config_for("llama")
    model = tiny_models.build(cfg, seed=1)
    nn.quantize(model, group_size=32, bits=8)
    assert blas_layout.prepare(model) == 0
    half = tiny_models.build(cfg, seed=1)
    half.set_dtype(mx.float16)
    assert blas_layout.prepare(half) == 0 and cpu.layout(half) == "mlx"


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(blas_layout.ENV_OFF, "0")
    model = tiny_models.build(tiny_models.config_for("llama"), seed=1)
    assert blas_layout.prepare(model) == 0 and linears(model)


def test_pruned_head_on_a_prepared_model(monkeypatch):
    from mlxspec.cpu import draft_weights

    monkeypatch.setenv(draft_weights.ENV, "0")  # the rows as they are (int8 rows: test_vocab_subset.py)
    cfg = tiny_models.config_for("llama")
    model = tiny_models.build(cfg, seed=4, scale=2.0)
    x = mx.array([[5, 17, 42, 9]])
    full = np.array(model(x)[0])
    blas_layout.prepare(model)
    assert isinstance(model.lm_head, TransposedLinear)
    ids = [3, 7, 8, 100, 250, 299]
    head = SubsetHead(model, ids, cfg["vocab_size"])
    sub = np.array(head.model(x)[0])
    np.testing.assert_allclose(sub, full[:, ids], rtol=1e-5, atol=1e-5)
    assert head.include([11])  # widening adds rows from the transposed head too (logits in the order of ids)
    assert sorted(np.array(head.ids).tolist()) == sorted(ids + [11])
    np.testing.assert_allclose(np.array(head.model(x)[0]), full[:, np.array(head.ids)], rtol=1e-5, atol=1e-5)


def test_loading_lays_out_the_models(tiny_pair):
    """mlxspec.load on the CPU backend: target and draft converted (packed, with the
    small-batch kernel: random float32 weights stay float32; the draft's are int8 where
    cpu/draft_weights.py can), and the greedy speculative output still equals plain decoding's."""
    from mlxspec.cpu import draft_weights

    want = "packed f32" if packed_weights.available() else "blas"
    assert cpu.layout(tiny_pair.target) == want
    assert cpu.layout(tiny_pair.draft) == ("packed i8" if draft_weights.wanted() else want)
    prompt = "the quick brown fox"
    plain = mlxspec.generate(tiny_pair, prompt, max_tokens=24, drafter="none")
    spec = mlxspec.generate(tiny_pair, prompt, max_tokens=24, num_draft=4)
    assert spec.tokens == plain.tokens and spec.stats.draft_proposed > 0


def test_a_calibration_belongs_to_one_layout(tiny_pair_dirs):
    pair = mlxspec.load(*tiny_pair_dirs)
    drafter = ModelDrafter(pair.draft)
    key = calibration_cache.cache_key(pair, drafter)
    stock = mlxspec.load(*tiny_pair_dirs)
    stock.target = tiny_models.build(tiny_models.config_for("qwen2"), seed=0, scale=3.0)  # mlx-lm's layout
    assert cpu.layout(stock.target) == "mlx"
    assert key is not None and calibration_cache.cache_key(stock, drafter) != key
