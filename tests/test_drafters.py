"""Prompt lookup and layer-skip self-speculation: unit tests of the drafters
themselves (their losslessness is tested with the core tests, parameterised)."""

import json

import mlx.core as mx
import numpy as np
import pytest

import drafter_models
import mlxspec
import tiny_models
from mlxspec.api import make_decoder, make_drafter, make_policy
from mlxspec.core.cache import ModelState
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import EMPTY, LayerSkipDrafter, LayerSkipModel, PromptLookupDrafter, skip_layout
from mlxspec.core.sampling import SamplingParams
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats

GREEDY = SamplingParams()


# -- prompt lookup -------------------------------------------------------------

def test_lookup_proposes_what_followed_the_last_occurrence():
    d = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    h = [10, 11, 12, 13, 14, 50, 10, 11, 12]
    assert d.propose(h, 3, GREEDY, None).tokens == [13, 14, 50]
    assert d.propose(h, 1, GREEDY, None).tokens == [13]
    # past the end of the history the copy repeats with the match's period (6 here)
    assert d.propose(h, 8, GREEDY, None).tokens == [13, 14, 50, 10, 11, 12, 13, 14]
    assert d.propose([1, 2, 3, 1, 2, 3, 1, 2], 5, GREEDY, None).tokens == [3, 1, 2, 3, 1]
    assert d.propose([7, 7, 7], 4, GREEDY, None).tokens == [7, 7, 7, 7]
    assert d.propose(h, 3, GREEDY, None).q is None  # deterministic


def test_lookup_prefers_the_longest_ngram_then_the_most_recent():
    d = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    # "7 8" occurs twice: followed by 1 then by 2; "6 7 8" once, followed by 3
    h = [6, 7, 8, 3, 0, 7, 8, 1, 0, 7, 8, 2, 0, 6, 7, 8]
    assert d.propose(h, 1, GREEDY, None).tokens == [3]  # the trigram wins
    d2 = PromptLookupDrafter(max_ngram=2, min_ngram=1)
    assert d2.propose(h, 1, GREEDY, None).tokens == [2]  # bigram: the most recent occurrence
    d3 = PromptLookupDrafter(max_ngram=1, min_ngram=1)
    assert d3.propose([4, 5, 9, 4, 6, 4], 2, GREEDY, None).tokens == [6, 4]


def test_lookup_without_a_match_proposes_nothing_and_min_ngram_is_respected():
    d = PromptLookupDrafter(max_ngram=3, min_ngram=2)
    assert d.propose([1, 2, 3, 4, 5, 3], 4, GREEDY, None) is EMPTY  # only a unigram matches
    assert d.propose([1, 2, 3, 4, 5, 3], 0, GREEDY, None) is EMPTY
    assert PromptLookupDrafter().propose([9], 4, GREEDY, None) is EMPTY
    with pytest.raises(ValueError):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_lookup_index_follows_growth_and_rewrites_of_the_history():
    d = PromptLookupDrafter(max_ngram=2, min_ngram=1)
    h = [1, 2, 3, 1]
    assert d.propose(h, 2, GREEDY, None).tokens == [2, 3]
    h += [2, 3, 4, 1, 2]  # grows: the most recent "1 2" is now followed by 3 4
    assert d.propose(h, 3, GREEDY, None).tokens == [3, 4, 1]
    # a different conversation (the history is rewritten, not extended): no stale matches
    assert d.propose([7, 8, 9, 7], 2, GREEDY, None).tokens == [8, 9]
    assert d.propose([7, 8, 9, 7], 4, GREEDY, None).tokens == [8, 9, 7, 8]
    assert d.propose([5, 6, 1], 2, GREEDY, None) is EMPTY


def _brute_force_lookup(text: list[int], searched: int, k: int, max_n: int = 3) -> list[int]:
    """k tokens continuing `text`: after the latest match of its last n tokens (n from
    max_n down to 1) that ends within text[:searched - 1], what followed, repeated
    with the match's period; [] without a match."""
    for n in range(min(max_n, len(text)), 0, -1):
        ends = [e for e in range(n - 1, searched - 1) if text[e - n + 1: e + 1] == text[-n:]]
        if ends:
            return (text[ends[-1] + 1:] * k)[:k]
    return []


def test_lookup_index_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    d = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    h = []
    for step in range(300):
        h.append(int(rng.integers(0, 6)))
        got = d.propose(h, 4, GREEDY, None).tokens
        assert got == _brute_force_lookup(h, len(h), 4), (step, h[-6:])


def test_lookup_after_a_path_matches_a_brute_force_search_and_keeps_the_index():
    """lookup(history, k, path): the latest occurrence in the history of the last n
    tokens of history + path, continued through history + path with its period; the
    index still describes the history alone (no rebuild for the next node's path)."""
    rng = np.random.default_rng(1)
    d = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    for step in range(200):
        h = rng.integers(0, 5, int(rng.integers(1, 30))).tolist()
        path = rng.integers(0, 5, int(rng.integers(0, 5))).tolist()
        got = d.lookup(h, 4, path)
        assert got == _brute_force_lookup(h + path, len(h), 4), (step, h, path)
        assert d._tokens == h


def test_lookup_finds_matches_in_a_generation():
    """On input-grounded text (the prompt quotes what the target goes on to say: with
    attention switched off the target's next token depends on the current one only),
    the lookups are found and kept; the output equals plain decoding."""
    target = drafter_models.lookup_target("qwen2", damp=0.0)
    prompt = drafter_models.grounded_prompt(target, [40, 41, 42, 43, 44], n=20)
    plain = [t for t, _ in SpeculativeDecoder(target).generate(list(prompt), max_tokens=20)]
    stats = GenerationStats()
    got = [t for t, _ in SpeculativeDecoder(target, PromptLookupDrafter(), FixedK(4)).generate(
        list(prompt), max_tokens=20, stats=stats)]
    assert got == plain
    assert stats.drafter == "prompt-lookup"
    assert stats.draft_accepted >= 10 and stats.target_passes <= 10, stats.to_dict()


@pytest.mark.real
def test_lookup_on_the_benchmarks_code_edit():
    """SmolLM2-135M on benchmarks/drafters.py's code-editing prompt (rename an attribute,
    reply with the code): most of the answer is drafted by lookup from the prompt,
    token-identical to plain decoding."""
    from bench_util import load_benchmark

    bench = load_benchmark("drafters")
    pair = mlxspec.load("smollm2-135m")
    plain = mlxspec.generate(pair, bench.EDIT_PROMPT, max_tokens=40, drafter="none", chat_template=True)
    res = mlxspec.generate(pair, bench.EDIT_PROMPT, max_tokens=40, drafter="lookup", num_draft=6,
                           chat_template=True)
    assert res.tokens == plain.tokens
    assert "def common_prefix(a, b):" in res.text  # it quotes the code
    assert res.stats.tokens_per_pass > 3, res.stats.summary()


# -- layer skip ----------------------------------------------------------------

ARCHS = {
    "llama": dict(),
    "qwen2": dict(),
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4, sliding_window_pattern=2),
}


def arch_model(arch, layers=4):
    cfg = tiny_models.config_for(arch, layers=layers)
    cfg.update(ARCHS[arch])
    return tiny_models.build(cfg, seed=3, scale=3.0)


def manual_forward(model, keep, tokens):
    """Reference for a llama/qwen2 with only `keep` layers: embed, kept layers, norm, head."""
    inner = model.model
    h = inner.embed_tokens(mx.array(tokens)[None])
    for i in keep:
        h = inner.layers[i](h, "causal", None)
    h = inner.norm(h)
    return model.lm_head(h)[0] if hasattr(model, "lm_head") else inner.embed_tokens.as_linear(h)[0]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_layerskip_keeping_every_layer_is_the_target(arch):
    """The view runs the model's own forward code: with no layer skipped it is the
    target exactly, incrementally with its cache too (gemma3: sliding windows, scaled embeddings)."""
    model = arch_model(arch)
    tokens = [5, 9, 33, 7, 200, 14, 14, 60, 2, 99]
    full = LayerSkipModel(model, range(4))
    np.testing.assert_allclose(np.array(full(mx.array(tokens)[None])[0]), np.array(model(mx.array(tokens)[None])[0]),
                               atol=1e-5)
    st, ref = ModelState(full), ModelState(model)
    for chunk in ([5, 9, 33], [7], [200, 14], [14, 60, 2, 99]):
        a, b = st.forward(chunk), ref.forward(chunk)
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_layerskip_runs_only_the_kept_layers_and_shares_weights(arch):
    model = arch_model(arch)
    tokens = [5, 9, 33, 7, 200, 14]
    for keep in ([0, 1], [0, 2, 3], [3]):
        got = LayerSkipModel(model, keep)(mx.array(tokens)[None])[0]
        np.testing.assert_allclose(np.array(got), np.array(manual_forward(model, keep, tokens)), atol=1e-4)
    d = LayerSkipDrafter(model, keep=[0, 3])
    assert d.state.model.layers[0] is model.model.layers[0]  # the same module, not a copy
    assert "2/4" in d.name


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("keep", [[0, 3], [1, 2], [2]])
def test_layerskip_incremental_equals_one_shot(arch, keep):
    """Fed in pieces through its cache (gemma3: past its 4-token sliding window, with
    the mask-defining layers skipped) the skip model gives the one-shot logits."""
    sm = LayerSkipModel(arch_model(arch), keep)
    tokens = [5, 9, 33, 7, 200, 14, 14, 60, 2, 99, 41, 8, 8, 17]
    one_shot = np.array(sm(mx.array(tokens)[None])[0])
    st, pos = ModelState(sm), 0
    for n in (3, 1, 1, 5, 1, 3):
        got = np.array(st.forward(tokens[pos: pos + n]))
        np.testing.assert_allclose(got, one_shot[pos: pos + n], atol=1e-4)
        pos += n


def test_layerskip_cache_advances_every_layer_with_dummies():
    """Skipped layers' caches keep the offsets (masks, trimming) with 1-wide dummy keys."""
    model = arch_model("qwen2")
    st = ModelState(LayerSkipModel(model, [0, 3]))
    st.forward([1, 2, 3, 4, 5])
    mx.eval([c.state for c in st.cache])
    assert [c.offset for c in st.cache] == [5] * 4
    assert st.cache[1].keys.shape[-1] == 1 and st.cache[0].keys.shape[-1] > 1
    st.sync([1, 2, 3, 9])
    assert [c.offset for c in st.cache] == [3] * 4


def test_skip_layouts():
    assert skip_layout(24, "middle") == [i for i in range(24) if not 8 <= i < 14]
    assert skip_layout(30, "first-half") == list(range(15))
    assert skip_layout(5, "every-other") == [0, 2, 4]
    assert skip_layout(6, "every-other") == [0, 2, 4, 5]
    assert skip_layout(2, "middle") == [1]
    with pytest.raises(ValueError):
        skip_layout(8, "nope")
    with pytest.raises(ValueError):
        LayerSkipModel(arch_model("llama"), [7])


def test_layerskip_p_min_stops_drafting():
    model = arch_model("llama")
    h = [5, 9, 33]
    full = LayerSkipDrafter(model, keep=[0, 1, 2, 3]).propose(h, 4, GREEDY, None)
    assert len(full) == 4
    assert len(LayerSkipDrafter(model, keep=[0, 1, 2, 3], p_min=1.01).propose(h, 4, GREEDY, None)) == 0


# -- the API and CLI -------------------------------------------------------------

def test_drafters_by_name_and_default_policies(tiny_pair):
    assert isinstance(make_drafter(tiny_pair, "lookup"), PromptLookupDrafter)
    assert isinstance(make_drafter(tiny_pair, "prompt-lookup"), PromptLookupDrafter)
    assert isinstance(make_drafter(tiny_pair, "layerskip"), LayerSkipDrafter)
    assert isinstance(make_drafter(tiny_pair, "layer-skip"), LayerSkipDrafter)
    with pytest.raises(mlxspec.MlxspecError):
        make_drafter(tiny_pair, "telepathy")
    for name in ("model", "lookup", "layerskip"):
        d = make_drafter(tiny_pair, name)
        assert isinstance(make_policy(None, d), PerToken)  # auto is the default for every drafter
        assert isinstance(make_policy("auto", d), PerToken)
        p = make_policy(3, d)
        assert isinstance(p, FixedK) and p.k == 3
    assert make_policy(None, make_drafter(tiny_pair, "none")).k == 0


@pytest.mark.parametrize("drafter", ["lookup", "layerskip"])
def test_decoder_with_each_drafter_matches_plain_greedy(tiny_pair, drafter):
    for num_draft in (None, 3):
        res = mlxspec.generate(tiny_pair, "one two one two one", max_tokens=30, drafter=drafter, num_draft=num_draft)
        plain = mlxspec.generate(tiny_pair, "one two one two one", max_tokens=30, drafter="none")
        assert res.tokens == plain.tokens
        s = res.stats
        assert s.tokens_plain + s.tokens_speculative == s.generated_tokens == len(res.tokens)


def test_cli_lookup_drafter_json(tiny_pair_dirs):
    from test_api_cli import run_cli

    target, _ = tiny_pair_dirs
    r = run_cli("generate", "--model", str(target), "--drafter", "lookup", "-p", "ab ab ab ab", "-m", "20", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stats"]["drafter"] == "prompt-lookup" and "no draft" in out["pair"]
    assert out["stats"]["tokens_plain"] + out["stats"]["tokens_speculative"] == len(out["tokens"])


def test_decoder_reuse_with_lookup_and_layerskip_across_generations(tiny_pair):
    """A reused decoder (chat) keeps the drafters' state consistent across turns."""
    for name in ("lookup", "layerskip"):
        dec = make_decoder(tiny_pair, name, 4)
        plain = SpeculativeDecoder(tiny_pair.target)
        h1, h2 = [5, 6, 7, 5, 6], [5, 6, 7, 5, 6]
        for turn in ([8, 9], [10, 5, 6]):
            a = [t for t, _ in dec.generate(h1, max_tokens=12, stats=GenerationStats())]
            b = [t for t, _ in plain.generate(h2, max_tokens=12)]
            assert a == b
            h1 += turn
            h2 += turn
