"""OpenAI's presence/frequency penalties, logit_bias and logprobs (issue 61), exactly.

The penalties and the bias are logits processing shared by p and q
(core/sampling.process_logits), so speculative output stays the target's: greedy and
coupled (seeded) speculative runs equal plain decoding token for token with them on,
chains and trees; rejection-sampled 3-token sequences follow the exact penalised
sequence distribution (chi-square), and the same counts are far from the unpenalised
one and from penalties that count the prompt (the test has power); a control that
verifies every row under the round's first context (the drafted tokens left out of
the counts) breaks greedy equality.  The penalties count generated tokens only (the prompt is
excluded, as OpenAI and vLLM count).  Logprobs are read off the verify pass: each
emitted token's log-probability and top alternatives equal a fresh full forward's
processed row, and asking for them changes no token."""

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

import test_sequence_distribution as sd
import tiny_models
from mlxspec.core.options import BadValue
from mlxspec.core.sampling import SamplingParams, process_logits
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.core.stats import GenerationStats
from stats_util import chi_square

PROMPT = [7, 19, 200, 31, 31, 5, 9, 12]
TOKENS = 32
SAMPLES = 300  # at these seeds: the exact check passes at p 0.56, the power checks fail at p 1e-8 and 1e-20
PENALTIES = dict(presence_penalty=0.6, frequency_penalty=0.4, logit_bias={"3": 2.5, "17": -100})


@pytest.fixture(scope="module")
def pair():
    cfg = tiny_models.config_for("llama")
    target = tiny_models.build(cfg, seed=0, scale=1.0)  # flat enough that it repeats itself: penalties bite
    draft = tiny_models.perturbed(target, cfg, noise=0.05, seed=1)
    return target, draft


def run(target, draft, k, params, tree=False, logprobs=None, prompt=PROMPT):
    policy = PerToken(assumed(0.05, slope=0.0, width=40), 8) if k == "auto" else FixedK(k)
    dec = SpeculativeDecoder(target, ModelDrafter(draft) if k else None, policy, tree=tree)
    stats = GenerationStats()
    out = list(dec.generate(list(prompt), params, max_tokens=TOKENS, stats=stats, logprobs=logprobs))
    return out, stats


def test_penalties_follow_openai_formula_over_generated_tokens_only():
    logits = mx.array(np.random.default_rng(0).normal(size=(2, 12)).astype(np.float32))
    ctx = [[4, 4, 9], [4, 4, 9, 5, 5, 5, 4]]  # prompt [4, 4, 9]; row 1 generated 5, 5, 5, 4
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={"2": 1.5, "99": 3},
                       completion_start=3)
    got = np.array(process_logits(logits, p, ctx))
    raw = np.array(logits, dtype=np.float64)
    raw[:, 2] += 1.5  # id 99 is past the vocabulary: left out
    raw[1, 5] -= 0.5 + 0.25 * 3
    raw[1, 4] -= 0.5 + 0.25 * 1  # the prompt's two 4s do not count
    want = raw - np.log(np.exp(raw).sum(axis=1, keepdims=True))
    assert np.allclose(got, want, atol=1e-5)
    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(logit_bias={"5": 101}),
                dict(logit_bias={"x": 1})):
        with pytest.raises(BadValue):
            SamplingParams(**bad)


@pytest.mark.parametrize("params", [SamplingParams(**PENALTIES), SamplingParams(temp=0.9, seed=5, **PENALTIES)],
                         ids=["greedy", "coupled"])
def test_speculative_equals_plain_with_penalties(pair, params):
    target, draft = pair
    plain = [t for t, *_ in run(target, draft, 0, params)[0]]
    unpenalised = [t for t, *_ in run(target, draft, 0, dataclasses.replace(params, presence_penalty=0.0,
                                                                         frequency_penalty=0.0, logit_bias=()))[0]]
    assert plain != unpenalised  # the penalties change the text, so the equalities below mean something
    assert 17 not in plain  # a -100 bias rules the token out
    accepted = 0
    for k, tree in ((1, False), (3, False), (8, False), ("auto", None)):
        got, stats = run(target, draft, k, params, tree=tree)
        assert [t for t, *_ in got] == plain, (k, tree)
        accepted += stats.draft_accepted
    assert accepted > 0


def test_control_rows_without_their_drafted_tokens_break_equality(pair, monkeypatch):
    import mlxspec.decoder as decoder_mod

    for name in ("process_logits", "greedy_scores"):  # greedy verification reads greedy_scores
        real = getattr(decoder_mod, name)
        monkeypatch.setattr(decoder_mod, name, lambda logits, params, contexts=None, real=real:
                            real(logits, params, contexts and [contexts[0]] * len(contexts)))
    target, draft = pair
    params = SamplingParams(**PENALTIES)
    plain = [t for t, *_ in run(target, draft, 0, params)[0]]
    assert any([t for t, *_ in run(target, draft, k, params)[0]] != plain for k in (1, 3))


def test_rejection_sampling_follows_the_penalised_distribution():
    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    target = tiny_models.build(cfg, seed=3, scale=1.5)
    draft = tiny_models.build(cfg, seed=4, scale=1.5)
    params = SamplingParams(temp=1.0, presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"2": 1.0})
    exact = sd.exact_sequence_probs(target, dataclasses.replace(params, completion_start=len(sd.PROMPT)))
    counts, accepted = sd.sample_sequences(target, draft, params, samples=SAMPLES)
    assert accepted > SAMPLES // 4
    stat, df, pval = chi_square(counts, exact, SAMPLES)
    print(f"penalised: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"
    # power: the same samples against the unpenalised target, and against penalties counting the prompt
    for other in (SamplingParams(temp=1.0), params):
        stat, df, pval = chi_square(counts, sd.exact_sequence_probs(target, other), SAMPLES)
        print(f"against {other}: p={pval:.3g}")
        assert pval < 1e-3, (other, pval)


@pytest.mark.parametrize("tree", [False, None], ids=["chains", "trees"])
def test_logprobs_are_the_targets_processed_rows(pair, tree):
    target, draft = pair
    params = SamplingParams(temp=0.8, seed=3, top_k=30, presence_penalty=0.3)
    out, stats = run(target, draft, "auto", params, tree=tree, logprobs=5)
    plain, _ = run(target, draft, 0, params)
    assert [t for t, *_ in out] == [t for t, *_ in plain]  # asking for logprobs changes nothing
    assert stats.draft_accepted > 0 and (tree is False or stats.tree_rounds > 0)
    toks = [t for t, *_ in out]
    seq = PROMPT + toks
    logits = target(mx.array(seq)[None])[0, len(PROMPT) - 1: -1]
    full = dataclasses.replace(params, completion_start=len(PROMPT))
    ref = np.array(process_logits(logits, full, [seq[: len(PROMPT) + i] for i in range(len(toks))]))
    for i, (tok, _, (lp, top)) in enumerate(out):
        assert abs(lp - max(ref[i, tok], -9999.0)) < 2e-3, i
        assert len(top) == 5
        best = np.argsort(-ref[i])[:5]
        assert [t for t, _ in top][:2] == best[:2].tolist() or abs(top[0][1] - top[1][1]) < 1e-4
        assert np.allclose([v for _, v in top], np.maximum(ref[i, [t for t, _ in top]], -9999.0), atol=2e-3)
        assert top[0][1] >= top[-1][1]


def test_the_python_api_takes_them(tiny_pair):
    import mlxspec

    kw = dict(max_tokens=8, chat_template=False, presence_penalty=0.5, frequency_penalty=0.5)
    free = mlxspec.generate(tiny_pair, "hello there", num_draft=3, **kw).tokens
    banned = free[0]
    chunks = list(mlxspec.stream_generate(tiny_pair, "hello there", num_draft=3, logprobs=2,
                                          logit_bias={str(banned): -100}, **kw))
    tokens = [c.token for c in chunks if c.token >= 0]
    assert banned not in tokens and len(tokens) == 8
    assert all(len(c.logprobs[1]) == 2 and c.logprobs[1][0][0] == c.token for c in chunks if c.token >= 0)
    with pytest.raises(BadValue):
        mlxspec.generate(tiny_pair, "hello", presence_penalty=5)
