"""`--kv-bits` / `kv_bits=`: the target's KV cache quantized as mlx-lm's (QuantizedKVCache
from position 0).  Greedy speculative output (chains and trees) equals mlx-lm's own
generate_step with the same quantized cache; after any accept pattern the cache equals a
fresh quantized prefill of the kept tokens (each position is quantized on its own, groups
along the head dimension, so trimming and feeding again is exact).  Controls: the same
comparison against an unquantized plain run differs, and so does a cache whose trim is
broken."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache

import tiny_models
from mlxspec.core.cache import ModelState
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.drafting.drafters import ModelDrafter

MAX_TOKENS = 40
# head_dim 64: groups of 64 or 32 along it
CFG = tiny_models.config_for("llama", hidden=128, heads=2, kv_heads=1)
TARGET = tiny_models.build(CFG, seed=21, scale=3.0)
DRAFTS = [tiny_models.perturbed(TARGET, CFG, noise=n, seed=2) for n in (0.01, 0.1)]
PROMPTS = [[7, 19, 200, 31, 31, 5], [40, 41, 42, 43], [9] * 11 + [100, 101]]
QUANTS = [(4, 64), (8, 64), (4, 32)]


def mlx_lm_greedy(prompt, bits, group, n=MAX_TOKENS):
    out = []
    for tok, _ in generate_step(mx.array(prompt), TARGET, max_tokens=n, kv_bits=bits,
                                kv_group_size=group, quantized_kv_start=0):
        out.append(int(tok))
    return out


def speculative(prompt, drafter, policy, tree, bits, group):
    dec = SpeculativeDecoder(TARGET, drafter, policy, tree=tree, kv_bits=bits, kv_group_size=group)
    if tree:
        assert dec.trees, dec.tree_note
    got = [t for t, _ in dec.generate(list(prompt), max_tokens=MAX_TOKENS)]
    assert all(isinstance(c, QuantizedKVCache) for c in dec.target.cache)
    return got


def wide(max_k=8):
    return PerToken(assumed(0.05, slope=0.0, width=40), max_k)


@pytest.mark.parametrize("bits,group", QUANTS)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_chains_equal_mlx_lm_quantized(bits, group, prompt):
    want = mlx_lm_greedy(prompt, bits, group)
    for draft in DRAFTS:
        for k in (1, 3, 6):
            assert speculative(prompt, ModelDrafter(draft), FixedK(k), False, bits, group) == want


@pytest.mark.parametrize("bits,group", QUANTS)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_trees_equal_mlx_lm_quantized(bits, group, prompt):
    want = mlx_lm_greedy(prompt, bits, group)
    for draft in DRAFTS:
        assert speculative(prompt, ModelDrafter(draft), wide(), True, bits, group) == want


def test_control_unquantized_plain_differs():
    """The test can fail: 4-bit speculative output is not the unquantized plain run's."""
    differs = 0
    for prompt in PROMPTS:
        plain = [int(t) for t, _ in generate_step(mx.array(prompt), TARGET, max_tokens=MAX_TOKENS)]
        differs += speculative(prompt, ModelDrafter(DRAFTS[0]), FixedK(3), False, 4, 32) != plain
    assert differs


def _quantized_arrays(state, n):
    mx.eval([c.state[:2] for c in state.cache])
    return [np.array(a[..., :n, :]) for c in state.cache for a in (*c.keys, *c.values)]


def assert_fresh_quantized(state: ModelState, history, prompt, quant):
    """The cache equals mlx-lm's way to it: the prompt prefilled, quantized, then the
    kept tokens fed one at a time."""
    kept = history[:-1]
    assert state.tokens == kept
    fresh = ModelState(state.model, kv_quant=quant)
    fresh.prefill(list(prompt))
    for t in history[len(prompt) - 1:-1]:
        fresh.forward([t])
    for c in state.cache:
        assert c.offset == len(kept)
    for a, b in zip(_quantized_arrays(state, len(kept)), _quantized_arrays(fresh, len(kept))):
        np.testing.assert_allclose(a, b, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("bits,group", QUANTS)
def test_cache_equals_fresh_quantized_prefill(bits, group, tree):
    rng = np.random.default_rng(bits * 100 + group + tree)
    for _ in range(4):
        prompt = [int(x) for x in rng.integers(5, 299, size=rng.integers(2, 12))]
        draft = DRAFTS[int(rng.integers(0, 2))]
        policy = wide(int(rng.integers(1, 7))) if tree else FixedK(int(rng.integers(1, 7)))
        dec = SpeculativeDecoder(TARGET, ModelDrafter(draft), policy, tree=tree, kv_bits=bits, kv_group_size=group)
        h = list(prompt)
        for _ in dec.generate(h, max_tokens=int(rng.integers(1, 25))):
            pass
        dec.target.sync(h)
        assert_fresh_quantized(dec.target, h, prompt, (bits, group))


def test_control_broken_trim_is_caught(monkeypatch):
    """A trim that forgets to move the offset back leaves stale positions: caught."""
    monkeypatch.setattr(QuantizedKVCache, "trim", lambda self, n: n)
    dec = SpeculativeDecoder(TARGET, ModelDrafter(DRAFTS[1]), FixedK(6), tree=False, kv_bits=4, kv_group_size=32)
    prompt = [7, 19, 200, 31, 31, 5]
    h = list(prompt)
    for _ in dec.generate(h, max_tokens=20):
        pass
    dec.target.sync(h)
    with pytest.raises(AssertionError):
        assert_fresh_quantized(dec.target, h, prompt, (4, 32))


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_bad_kv_bits_refused_in_one_line(tmp_path, command):
    """A usage error (exit 2) in one line, before anything is loaded (the folder is empty)."""
    import subprocess
    import sys

    extra = ["-p", "hi"] if command == "generate" else []
    for args in (["--kv-bits", "3"], ["--kv-bits", "4", "--kv-group-size", "48"]):
        r = subprocess.run([sys.executable, "-m", "mlxspec.cli", command, "--model", str(tmp_path), *extra, *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "must be" in lines[0], r.stderr


def test_api_refuses_bad_kv_bits_and_bounded_cache():
    from mlxspec.core.options import BadValue
    from mlxspec.errors import MlxspecError

    with pytest.raises(BadValue, match="kv_bits must be 4 or 8"):
        from mlxspec.api import make_decoder

        make_decoder(None, kv_bits=5)
    with pytest.raises(MlxspecError, match="do not go together"):
        SpeculativeDecoder(TARGET, max_kv_size=64, kv_bits=4)


def test_api_stream_generate_and_session_pass_kv_bits(tmp_path):
    """The API's keywords reach the target's cache; the output is mlx-lm's quantized run's."""
    import mlxspec

    tiny_models.save_model_dir(tmp_path / "t", arch="llama", model=TARGET, cfg_overrides=CFG)
    pair = mlxspec.load(str(tmp_path / "t"), no_draft=True)
    ids = [7, 19, 200, 31, 31, 5]
    res = mlxspec.generate(pair, ids, max_tokens=12, drafter="lookup", kv_bits=4, kv_group_size=32)
    assert res.tokens == mlx_lm_greedy(ids, 4, 32, 12)[:len(res.tokens)]
    s = mlxspec.Session(pair, drafter="lookup", kv_bits=8, chat_template=False)
    assert s.decoder.target.kv_quant == (8, 64)
