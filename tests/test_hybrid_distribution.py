"""Sequence level at temperature > 0: 3-token speculative samples from hybrid and
state-space targets follow the target's exact sequence probabilities (chi-square,
fixed seeds), with an attention-only draft, a hybrid draft and prompt lookup;
and the test has power: a rollback that does not restore the recurrent state
(the control) fails it."""

import pytest

import tiny_hybrid
from mlxspec.costs.draft_length import FixedK
from mlxspec.drafting.drafters import ModelDrafter, PromptLookupDrafter
from mlxspec.core.sampling import SamplingParams
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from stats_util import chi_square
from test_hybrid_equality import break_rollback
from test_sequence_distribution import LENGTH, PROMPT, V, exact_sequence_probs

SAMPLES = 400  # the broken controls fail at p < 1e-15 with these (1.4e-16, 1.2e-39; threshold 1e-3);
# sound rollbacks pass at p > 0.6 (at 800: 8.7e-29, 6.9e-101; p > 0.3)
PARAMS = SamplingParams(temp=1.0)
LOOKUP_PROMPT = [4, 6, 5, 4, 6, 5, 4]  # picked among the 336 prompts "abcabca": lfm2 continues it with b half the time


def models():
    small = dict(vocab_size=V)
    return {
        "qwen3_5+qwen2": (tiny_hybrid.build("qwen3_5", seed=0, layer_scale=0.6, **small),
                          tiny_hybrid.build("qwen2", seed=2, **small)),
        "mamba2+qwen3_5": (tiny_hybrid.build("mamba2", seed=1, layer_scale=0.6, **small),
                           tiny_hybrid.build("qwen3_5", seed=0, **small)),
        "lfm2+lookup": (tiny_hybrid.build("lfm2", seed=3, family=None, layer_scale=1.5, **small), None),
    }


MODELS = models()


def sample(target, draft, prompt, k=3, broken=False):
    drafter = ModelDrafter(draft) if draft is not None else PromptLookupDrafter(max_ngram=2, min_ngram=1)
    dec = SpeculativeDecoder(target, drafter, FixedK(k))
    if broken:
        break_rollback(dec.target)
    counts, accepted, refed = {}, 0, 0
    for i in range(SAMPLES):
        s = GenerationStats()
        seq = tuple(t for t, _ in dec.generate(list(prompt), SamplingParams(temp=1.0, seed=1000 + i, sampling="rejection"),
                                               max_tokens=LENGTH, stats=s))
        counts[seq] = counts.get(seq, 0) + 1
        accepted += s.draft_accepted
        refed += s.refed_positions
    return counts, accepted, refed


@pytest.mark.parametrize("name", sorted(MODELS))
def test_samples_match_target_sequence_distribution(name):
    target, draft = MODELS[name]
    prompt = LOOKUP_PROMPT if draft is None else PROMPT
    probs = exact_sequence_probs(target, PARAMS, prompt)
    counts, accepted, refed = sample(target, draft, prompt)
    assert accepted > SAMPLES // 5 and refed > SAMPLES // 10, (accepted, refed)  # drafts kept, states rolled back
    stat, df, pval = chi_square(counts, probs, SAMPLES)
    print(f"{name}: chi2={stat:.1f} df={df} p={pval:.3g} accepted={accepted} refed={refed}")
    assert pval > 1e-3, f"chi2={stat:.1f} df={df} p={pval:.2e}"


@pytest.mark.parametrize("name", ["qwen3_5+qwen2", "mamba2+qwen3_5"])
def test_chi_square_fails_when_the_state_is_not_restored(name):
    target, draft = MODELS[name]
    probs = exact_sequence_probs(target, PARAMS, PROMPT)
    counts, _, _ = sample(target, draft, PROMPT, broken=True)
    stat, df, pval = chi_square(counts, probs, SAMPLES)
    print(f"{name} state not restored: chi2={stat:.1f} df={df} p={pval:.3g}")
    assert pval < 1e-3, f"an unrestored state went unnoticed: chi2={stat:.1f} df={df} p={pval:.2e}"
