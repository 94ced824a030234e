"""Memory budget of hybrid and state-space models: the recurrent state the budget
counts (from config.json alone) is what the real mlx_lm models hold after a
forward, KV caches count only attention layers, and the budget shows the state
as a row that does not grow with the context."""

import mlx.core as mx
import pytest

import tiny_hybrid
from mlxspec.models import memory
from mlxspec.core.cache import ModelState
from mlxspec.core.recurrent import is_recurrent, leaves, state_arrays


@pytest.mark.parametrize("arch", tiny_hybrid.HYBRIDS + ("qwen2",))
def test_state_size_and_layer_split_match_the_real_model(arch):
    cfg = tiny_hybrid.config(arch)
    state = ModelState(tiny_hybrid.build(arch))
    state.forward(list(range(5, 30)))
    mx.eval(state_arrays(state.cache))
    recurrent = [c for c in leaves(state.cache) if is_recurrent(c)]
    assert memory.recurrent_layers(cfg) == len(recurrent)
    assert memory.recurrent_state_bytes(cfg, 4) == sum(a.nbytes for c in recurrent for a in c.cache)
    attention = [c for c in leaves(state.cache) if not is_recurrent(c)]
    kv = sum(c.keys[..., : c.offset, :].nbytes + c.values[..., : c.offset, :].nbytes for c in attention)
    assert memory.kv_cache_bytes(cfg, 25, 4) == kv


def test_budget_rows_for_a_hybrid_pair():
    t, d = tiny_hybrid.config("qwen3_5"), tiny_hybrid.config("mamba2")
    rows = {}
    for ctx in (1024, 8192):
        b = memory.pair_budget(t, d, [], [], context=ctx, float_bytes=4, usable=1 << 40, usable_source="test")
        rows[ctx] = dict(b.rows)
    state_rows = [k for k in rows[1024] if "recurrent state" in k]
    assert len(state_rows) == 2 and all(rows[1024][k] == rows[8192][k] > 0 for k in state_rows)
    assert rows[1024]["draft KV cache (1024 tokens, 32-bit)"] == 0  # mamba2: no attention layers
    assert "x 16 snapshots" in state_rows[1] and "x 4 snapshots" in state_rows[0]


def test_delta_net_weights_estimate_matches_the_real_model():
    """`estimate_from_config` of a Qwen3.5 config gives the tensors mlx_lm builds."""
    from collections import Counter

    from mlx.utils import tree_flatten

    real = Counter(tuple(v.shape) for _, v in tree_flatten(tiny_hybrid.build("qwen3_5").parameters()))
    est = Counter(shape for _, shape in memory.estimate_from_config(tiny_hybrid.config("qwen3_5")))
    assert real == est


def test_pairs_lists_qwen35_with_its_state():
    from mlxspec.converters import catalog

    rows, _, _ = catalog.estimates(4096, budget_gb=64)
    hybrid = [e for e in rows if e.target.startswith("Qwen/Qwen3.5-")]
    assert {e.target for e in hybrid} == {"Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-27B"}
    for e in hybrid:
        assert e.draft == "Qwen/Qwen3.5-0.8B"
        assert any("recurrent state" in label for label, _ in e.f32.rows)
    assert "Qwen/Qwen3.5-9B" in catalog.table(rows)
