"""Sequence level: 3-token speculative samples follow the target's exact sequence
probabilities (chi-square, fixed seeds, thousands of samples); and the test has
power: it fails when the residual step is deliberately broken."""

import itertools

import mlx.core as mx
import numpy as np
import pytest

import tiny_models
from mlxspec import acceptance
from mlxspec.draft_length import FixedK
from mlxspec.drafters import ModelDrafter
from mlxspec.sampling import SamplingParams, process_logits
from mlxspec.speculative import SpeculativeDecoder
from stats_util import chi_square

V, LENGTH, SAMPLES = 8, 3, 3000
PROMPT = [1, 5, 2]
PARAMS = SamplingParams(temp=1.0)


@pytest.fixture(scope="module")
def models():
    cfg = tiny_models.config_for("llama", vocab_size=V, hidden=32, ffn=64)
    target = tiny_models.build(cfg, seed=3, scale=1.5)
    draft = tiny_models.build(cfg, seed=4, scale=1.5)  # an unrelated draft: many rejections
    return target, draft


def exact_sequence_probs(target, params):
    """P(y1 y2 y3 | prompt) = prod_i p(y_i | prompt, y_<i), by full forwards."""
    probs = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        tokens = PROMPT + list(seq)
        logits = target(mx.array(tokens)[None])[0, len(PROMPT) - 1: -1]
        lp = process_logits(logits, params, [tokens[: len(PROMPT) + i] for i in range(LENGTH)])
        probs[seq] = float(np.exp(np.array(lp)[np.arange(LENGTH), list(seq)].sum()))
    return probs


def sample_sequences(target, draft, params, k=2):
    dec = SpeculativeDecoder(target, ModelDrafter(draft), FixedK(k))
    counts, accepted = {}, 0
    for i in range(SAMPLES):
        p = SamplingParams(**{**params.to_dict(), "seed": 1000 + i})
        from mlxspec.stats import GenerationStats

        s = GenerationStats()
        seq = tuple(t for t, _ in dec.generate(list(PROMPT), p, max_tokens=LENGTH, stats=s))
        counts[seq] = counts.get(seq, 0) + 1
        accepted += s.draft_accepted
    return counts, accepted


@pytest.mark.parametrize("params", [PARAMS, SamplingParams(temp=0.8, top_k=5, repetition_penalty=1.3)],
                         ids=["temp1", "temp0.8-topk5-penalty"])
def test_speculative_samples_match_target_sequence_distribution(models, params):
    target, draft = models
    probs = exact_sequence_probs(target, params)
    assert abs(sum(probs.values()) - 1) < 1e-4
    counts, accepted = sample_sequences(target, draft, params)
    assert accepted > SAMPLES // 4  # the draft really contributed tokens
    stat, df, pval = chi_square(counts, probs, SAMPLES)
    print(f"chi2={stat:.1f} df={df} p={pval:.3g} accepted={accepted}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


def test_chi_square_fails_when_residual_is_broken(models, monkeypatch):
    """Resampling from p instead of norm(max(0, p - q)) after a rejection (a classic
    bug) biases the output towards the draft; the same test must catch it."""
    target, draft = models
    probs = exact_sequence_probs(target, PARAMS)
    monkeypatch.setattr(acceptance, "residual", lambda p, q, draft: p)
    counts, _ = sample_sequences(target, draft, PARAMS)
    stat, df, pval = chi_square(counts, probs, SAMPLES)
    print(f"broken residual: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval < 1e-3, f"broken residual went unnoticed: chi2={stat:.1f} df={df} p={pval:.2e}"
