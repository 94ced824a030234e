"""Fused sibling projections (cpu/fused_projections.py): q/k/v and gate/up stored side by
side compute each projection's columns bit for bit (every packed format, int8, biases
on some parts only, 1-33 rows), a later projection called with another input computes
its own product, a loaded model's logits (target and int8 draft) equal the unfused
model's bit for bit with fewer kernel calls and no extra weight bytes, greedy
speculative output equals plain decoding, and MLXSPEC_FUSED=0 turns it off."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlxspec
import tiny_models
from mlxspec.cpu import draft_weights, fused_projections, layers as lean_ops, packed_weights
from mlxspec.cpu.draft_weights import Int8Linear
from mlxspec.cpu.fused_projections import FusedFirst, FusedPart, fuse
from mlxspec.cpu.packed_weights import PackedLinear

pytestmark = pytest.mark.skipif(not packed_weights.available(), reason="no small-batch kernel: nothing is packed")

WIDE = {"hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 128}  # key/value projections 64 wide: whole blocks


def parts(fmt, widths=(128, 64, 64), k=128, biases=(True, True, False), seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n, has_bias in zip(widths, biases):
        w = rng.standard_normal((n, k)).astype(np.float16).astype(np.float32)
        if fmt == "bf16":
            w = (w.view(np.uint32) & 0xFFFF0000).view(np.float32)
        bias = mx.array(rng.standard_normal(n).astype(np.float32)) if has_bias else None
        if fmt == "i8":
            if not draft_weights.works():
                pytest.skip("no int8 kernel (needs AVX-512 VNNI)")
            out.append(Int8Linear.from_rows(w, bias))
        else:
            out.append(PackedLinear.from_weight(mx.array(w.T), bias, fmt))
    return out


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16", "i8"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 33])
def test_each_projection_gets_its_own_columns_bit_for_bit(fmt, rows):
    ps = parts(fmt) if fmt != "bf16" else parts(fmt, biases=(False, True, True))
    fused = fuse(ps)
    assert type(fused) is type(ps[0]) and fused.out_dims == sum(p.out_dims for p in ps)
    x = mx.array(np.random.default_rng(1).standard_normal((1, rows, 128)).astype(np.float32))
    y = np.array(fused(x))
    lo = 0
    for p in ps:
        assert np.array_equal(y[..., lo:lo + p.out_dims], np.array(p(x)))
        lo += p.out_dims


def test_what_cannot_be_stored_side_by_side_is_left_alone():
    assert fuse(parts("f16", widths=(128, 32, 32))) is None  # a narrow last block
    assert fuse(parts("f32")[:1] + parts("f16")[1:]) is None  # mixed formats
    assert fuse(parts("f16") + parts("f16", k=64, widths=(64,), biases=(False,))) is None  # other input width


def test_a_later_projection_called_with_another_input_computes_its_own():
    ps = parts("f16")
    first = FusedFirst(fuse(ps), 128)
    k, v = FusedPart(first, 128, 192), FusedPart(first, 192, 256, last=True)
    rng = np.random.default_rng(2)
    x, other = (mx.array(rng.standard_normal((1, 2, 128)).astype(np.float32)) for _ in range(2))
    assert np.array_equal(np.array(first(x)), np.array(ps[0](x)))
    assert np.array_equal(np.array(v(other)), np.array(ps[2](other)))  # not x: its own product
    assert np.array_equal(np.array(k(x)), np.array(ps[1](x)))
    assert first._last.pair[0] is x
    assert np.array_equal(np.array(v(x)), np.array(ps[2](x)))
    assert all(e is None for e in first._last.pair)  # the last one let go of the product (a prompt's is large)


def _loaded(tmp_path, monkeypatch, arch, fused: bool):
    monkeypatch.setenv(fused_projections.ENV, "1" if fused else "0")
    cfg = tiny_models.config_for(arch, **WIDE)
    if arch == "qwen3":
        cfg["head_dim"] = 32
    model = tiny_models.build(cfg, seed=3, scale=3.0)
    path = tiny_models.save_model_dir(tmp_path / arch, arch, model=model, cfg_overrides=cfg)
    return mlxspec.load(path, path)  # the same folder as target (16/32-bit) and as draft (int8)


def _calls(model, ids) -> tuple:
    from mlxspec.cpu import kernel as small_gemm

    before = small_gemm.packed_calls()
    out = np.array(model(ids))
    return out, small_gemm.packed_calls() - before


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_loaded_pair_computes_what_the_unfused_one_does(tmp_path, monkeypatch, arch):
    fused = _loaded(tmp_path / "a", monkeypatch, arch, True)
    plain = _loaded(tmp_path / "b", monkeypatch, arch, False)
    ids = mx.array([[1, 5, 9, 33, 2, 7, 60, 61, 12, 4]])
    for name in ("target", "draft"):
        a, b = getattr(fused, name), getattr(plain, name)
        layers = a.model.layers
        assert all(isinstance(layer.self_attn.q_proj, FusedFirst) for layer in layers)
        assert all(isinstance(layer.mlp, lean_ops.LeanMLP) and "gate_up" in layer.mlp for layer in layers)
        (ya, calls_a), (yb, calls_b) = _calls(a, ids), _calls(b, ids)
        assert np.array_equal(ya, yb)
        assert calls_a == calls_b - 3 * len(layers)  # q/k/v: one call instead of three, gate/up: one of two
        nbytes = [sum(v.nbytes for _, v in tree_flatten(m.parameters())) for m in (a, b)]
        assert nbytes[0] == nbytes[1]  # each weight stored once (the later parts hold no module of their own)
    assert isinstance(fused.draft.model.layers[0].mlp.gate_up, Int8Linear) or not draft_weights.works()


def test_greedy_speculative_equals_plain_on_a_fused_pair(tmp_path, monkeypatch):
    monkeypatch.setenv(fused_projections.ENV, "1")
    cfg = tiny_models.config_for("qwen2", **WIDE)
    target = tiny_models.build(cfg, seed=3, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=1)
    pair = mlxspec.load(tiny_models.save_model_dir(tmp_path / "t", "qwen2", model=target, cfg_overrides=cfg),
                        tiny_models.save_model_dir(tmp_path / "d", "qwen2", model=draft, cfg_overrides=cfg))
    assert isinstance(pair.draft.model.layers[0].self_attn.k_proj, FusedPart)
    tiny_models.check_greedy_packed_pair(pair)


def test_turned_off_by_environment(tmp_path):
    assert tiny_models.loaded_elsewhere(
        tmp_path / "llama", {fused_projections.ENV: "0"}, "from mlxspec.cpu import layers as lean_ops",
        "type(m.model.layers[0].mlp).__name__, 'gate_up' in m.model.layers[0].mlp") == ["LeanMLP", "False"]
    assert tiny_models.loaded_elsewhere(
        tmp_path / "llama2", {}, "from mlxspec.cpu import layers as lean_ops",
        "'gate_up' in m.model.layers[0].mlp") == ["True"]


def test_a_calibration_belongs_to_fused_or_separate_projections(tmp_path, monkeypatch):
    from mlxspec.costs import calibration as calibration_cache
    from mlxspec.drafting.drafters import ModelDrafter

    pair = _loaded(tmp_path, monkeypatch, "qwen2", True)
    key = calibration_cache.cache_key(pair, ModelDrafter(pair.draft))
    monkeypatch.setenv(fused_projections.ENV, "0")
    assert key is not None and calibration_cache.cache_key(pair, ModelDrafter(pair.draft)) != key
