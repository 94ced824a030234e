"""The Mac's path (issue 58): the lossless core with every Linux CPU kernel off
(MLXSPEC_CPU_KERNELS=0), on 4-bit quantized mlx-lm models (group sizes 32 and 64)
and float16 / bfloat16 activations.  tests/mac_path_checks.py runs every check in
ONE subprocess (the switch is read at import and load time); each test here asserts
on its figures.  Plus one `mlxspec serve --dtype float16` request, kernels off."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_models
from server_process import ServerProcess

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def figures():
    env = {**os.environ, "MLXSPEC_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, str(HERE / "mac_path_checks.py")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(fig["seconds"]))
    assert fig["kernels_off"] and fig["layout"] == "mlx"  # no CPU kernel touched the models
    return fig


def test_greedy_speculative_equals_plain_on_quantized_and_16_bit_pairs(figures):
    """Chains (fixed k, per-token policy) and trees: output equal to plain greedy, or
    diverging only at a near-tie the speculative run counted."""
    for config, f in figures["greedy"].items():
        assert f["runs"] == 6 and f["tokens"] > 0, (config, f)
        assert f["undetected"] == 0, (config, f)
        assert f["tree_rounds"] > 0, (config, f)  # trees really ran
        assert f["accepted"] > 10 and f["rejected"] > 10, (config, f)  # both paths of the rule
    assert {"q64", "q32-float16", "float16", "bfloat16"} <= set(figures["greedy"])


def test_divergences_fall_on_counted_near_ties_and_the_control_is_caught(figures):
    """Verify passes rounded unlike one-position steps by a few ulps: every divergence
    is at a counted near-tie (and there are some); moved far beyond rounding: a
    divergence the counter did not flag is seen, so the check has power."""
    nt = figures["near_ties"]
    within = [f for k, f in nt.items() if k.endswith("/within")]
    beyond = [f for k, f in nt.items() if k.endswith("/beyond")]
    assert all(f["undetected"] == 0 for f in within), nt
    assert sum(f["divergences"] for f in within) >= 1, nt  # not vacuous
    assert sum(f["undetected"] for f in beyond) >= 1, nt


def test_exact_sampling_chi_square_and_its_broken_control(figures):
    s = figures["sampling"]
    sound = next(v for k, v in s.items() if k != "broken-residual")
    assert abs(sound["total_prob"] - 1) < 1e-4
    assert sound["accepted"] > sound["samples"] // 4  # the draft contributed
    assert sound["p"] > 1e-3, s
    assert s["broken-residual"]["p"] < 1e-3, s


def test_caches_equal_a_fresh_prefill_after_random_accept_patterns(figures):
    for config, f in figures["caches"].items():
        assert f["runs"] >= 10 and f["mismatches"] == [], (config, f)


def test_a_sessions_second_turn_on_a_4bit_pair_in_float16(figures):
    s = figures["session"]
    assert s["quantized"] and "float16" in s["describe"], s
    assert s["first_tokens"] > 0 and s["second_tokens"] > 0
    assert s["second_ok"] and s["history_ok"], s
    assert s["processed"] < s["history"]  # the second turn fed only its new text


def test_one_server_request_with_kernels_off_in_float16(tmp_path):
    cfg = tiny_models.config_for("qwen2")
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=1)
    t = tiny_models.save_model_dir(tmp_path / "target", "qwen2", model=target)
    d = tiny_models.save_model_dir(tmp_path / "draft", "qwen2", model=draft)
    server = ServerProcess(tmp_path, "--model", str(t), "--draft", str(d), "--dtype", "float16",
                           "--num-draft", "3", extra_env={"MLXSPEC_CPU_KERNELS": "0"})
    try:
        status, body, _ = server.post("/v1/completions", {"prompt": "Once upon", "max_tokens": 8,
                                                          "temperature": 0})
        assert status == 200, body
        assert body["usage"]["completion_tokens"] > 0, body
    finally:
        server.stop()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_near_tie_is_a_top_2_gap_within_the_dtypes_rounding(dtype):
    """NEAR_TIE_ULPS * EPS[dtype] * max(|top|, 1): half of it is a near-tie, twice it is not."""
    import mlx.core as mx

    from mlxspec.core.acceptance import EPS, NEAR_TIE_ULPS, near_tie_threshold, near_ties

    top = 10.0
    thr = near_tie_threshold(dtype, top)
    assert thr == NEAR_TIE_ULPS * EPS[dtype] * top
    rows = mx.array([[top, top - thr / 2, 0.0], [top, top - 2 * thr, 0.0], [top, top, -1.0]], dtype=getattr(mx, dtype))
    assert near_ties(rows, rows.astype(mx.float32)).tolist() == [True, False, True]


def test_stats_record_near_ties_by_generated_position():
    from mlxspec.core.stats import GenerationStats

    s = GenerationStats()
    s.record_near_ties(0, [False, True])
    s.record_near_ties(2, [True])
    assert s.near_ties == 2 and s.near_tie_positions == [1, 2]
    assert s.to_dict()["near_ties"] == 2 and "2 near-ties" in s.summary()


def test_load_refuses_an_unknown_dtype_before_loading():
    import mlxspec

    with pytest.raises(mlxspec.MlxspecError, match="dtype must be one of float32, float16, bfloat16"):
        mlxspec.load("no-such-model", dtype="float8")


def test_an_mlx_without_per_row_rope_offsets_verifies_chains_with_a_note(monkeypatch):
    """Trees need `mx.fast.rope` with one offset per row (MLX 0.29.1): an older MLX gets
    chains and one line saying why, and the same output."""
    import mlx.core as mx

    import test_greedy_equality as ge
    from mlxspec.costs.cost_model import assumed
    from mlxspec.costs.draft_length import PerToken
    from mlxspec.core.stats import GenerationStats
    from mlxspec.decoder import SpeculativeDecoder
    from mlxspec.drafting.drafters import ModelDrafter
    from mlxspec.trees import round as tree_round

    assert tree_round.mlx_version("0.29.1") == (0, 29, 1) and tree_round.mlx_version("0.30.0.dev2025") == (0, 30, 0)
    assert tree_round.mlx_version() >= tree_round.TREES_NEED_MLX  # the floor pyproject.toml sets is above it
    target, drafts = ge.models("llama")
    prompt = [7, 19, 200, 31, 31, 5]
    monkeypatch.setattr(mx, "__version__", "0.28.0", raising=False)
    stats = GenerationStats()
    dec = SpeculativeDecoder(target, ModelDrafter(drafts[0]), PerToken(assumed(0.05, slope=0.0, width=40), 6),
                             tree=True)
    got = [t for t, _ in dec.generate(list(prompt), max_tokens=ge.MAX_TOKENS, stats=stats)]
    assert stats.tree_rounds == 0 and stats.draft_accepted > 0
    assert any("MLX 0.28.0 has no per-row RoPE offsets" in n and "0.29.1" in n for n in stats.notes), stats.notes
    assert got == ge.plain(target, prompt)
