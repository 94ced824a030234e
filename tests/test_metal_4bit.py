"""4-bit by default on Metal (issue 58 part 4), with the backend check faked (device.is_gpu):
a float16 folder converted from GGUF loads as 4-bit affine layers (group 64, embeddings and
lm_head too, as mlx_lm's convert -q makes them) and generates; on the CPU backend nothing is
quantised; the memory estimate follows."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

import mlxspec
from mlxspec import device
from mlxspec.models import loading, memory
from tests.tiny_models import make_model, save_model_dir

GGUF_SOURCE = {"source": "tiny-Q4_K_M.gguf", "sha256": "0" * 64, "file_type": "Q4_K_M"}


@pytest.fixture
def converted(tmp_path):
    """A tiny GGUF conversion as models/gguf/convert.py leaves it: float16 weights, config["mlxspec"]."""
    model = make_model("qwen2", hidden=128, ffn=256)
    model.set_dtype(mx.float16)
    return save_model_dir(tmp_path / "t", arch="qwen2", model=model, hidden=128, ffn=256,
                          cfg_overrides={"mlxspec": dict(GGUF_SOURCE)})


def fake_metal(monkeypatch, on: bool):
    monkeypatch.setattr(device, "is_gpu", lambda: on)
    monkeypatch.setenv("MLXSPEC_CPU_KERNELS", "0")
    monkeypatch.setenv("MLXSPEC_NO_MEMORY_CHECK", "1")


def quantized_layers(model):
    return [m for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]


def test_on_metal_a_gguf_conversion_loads_4bit_and_generates(converted, monkeypatch, tmp_path, capsys):
    fake_metal(monkeypatch, True)
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path / "calibration"))
    model, tok, config = loading.load_model_dir(converted, "target")
    q = quantized_layers(model)
    linears = [m for _, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    assert q and not linears  # every projection, the embedding and lm_head
    assert {(m.bits, m.group_size) for m in q} == {(4, 64)}
    assert any(isinstance(m, nn.QuantizedEmbedding) for m in q)
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 64
    assert not any(v.dtype == mx.float32 for _, v in tree_flatten(model.parameters()))  # scales stay float16
    pair = mlxspec.load(converted, converted)
    assert quantized_layers(pair.target) and quantized_layers(pair.draft)
    assert "(GGUF Q4_K_M, 4-bit, float16)" in pair.describe()
    result = mlxspec.generate(pair, "a b c", max_tokens=8, num_draft=2, temp=0.0)
    assert len(result.tokens) == 8
    assert "Quantized" not in capsys.readouterr().out  # mlx-lm's own line is not our output


def test_on_the_cpu_backend_nothing_is_quantised(converted, monkeypatch):
    fake_metal(monkeypatch, False)
    model, _, config = loading.load_model_dir(converted, "target")
    assert not quantized_layers(model) and "quantization" not in config
    assert memory.bits_at_load(config) is None


def test_plain_mlx_folders_and_the_switch_are_left_alone(tmp_path, converted, monkeypatch):
    fake_metal(monkeypatch, True)
    plain = save_model_dir(tmp_path / "plain", arch="qwen2")
    assert memory.bits_at_load(memory.read_config(plain)) is None  # not a GGUF conversion: its own dtype
    assert memory.bits_at_load(memory.read_config(converted)) == 4
    monkeypatch.setenv("MLXSPEC_METAL_4BIT", "0")
    assert memory.bits_at_load(memory.read_config(converted)) is None


@pytest.mark.parametrize("metal", [True, False])
def test_the_memory_estimate_is_the_4bit_figure_on_metal(converted, monkeypatch, metal):
    monkeypatch.setattr(device, "is_gpu", lambda: metal)
    monkeypatch.delenv("MLXSPEC_NO_MEMORY_CHECK", raising=False)
    budget = memory.check_pair_fits(converted, converted, budget_bytes=1 << 40)
    tensors = memory.local_tensors(converted)
    weights = [b for label, b in budget.rows if "weights" in label]
    if metal:
        assert weights == [memory.model_bytes(tensors, 4)] * 2  # 4 bits + float16 scale and bias per 64
        assert weights[0] < memory.model_bytes(tensors) / 3
    else:
        assert weights == [memory.model_bytes(tensors, None, 4)] * 2  # float32 compute on the CPU


def test_a_converted_target_with_a_plain_draft_is_budgeted_each_as_it_loads(tmp_path, converted, monkeypatch):
    monkeypatch.setattr(device, "is_gpu", lambda: True)
    monkeypatch.delenv("MLXSPEC_NO_MEMORY_CHECK", raising=False)
    plain = save_model_dir(tmp_path / "plain", arch="qwen2", hidden=128, ffn=256)
    budget = memory.check_pair_fits(converted, plain, budget_bytes=1 << 40)
    weights = [b for label, b in budget.rows if "weights" in label]
    assert weights == [memory.model_bytes(memory.local_tensors(converted), 4), memory.model_bytes(memory.local_tensors(plain))]
    assert "4-bit" in budget.rows[0][0] and "source dtype" in budget.rows[1][0]


def test_the_4bit_load_is_calibrated_apart_from_the_float16_one(converted, monkeypatch):
    from mlxspec.costs import calibration

    fake_metal(monkeypatch, True)
    pair = mlxspec.load(converted, no_draft=True)
    monkeypatch.setenv("MLXSPEC_METAL_4BIT", "0")
    plain16 = mlxspec.load(converted, no_draft=True)
    assert quantized_layers(pair.target) and not quantized_layers(plain16.target)
    lookup = mlxspec.api.make_drafter(plain16, "lookup")
    assert calibration.cache_key(pair, lookup) != calibration.cache_key(plain16, lookup)
