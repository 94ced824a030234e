"""What a greedy verify pass computes besides the forward: the argmax and the near-ties of
the processed logits, with no normalising pass over the vocabulary (a logsumexp over
every row, core/sampling.greedy_scores), and near-ties by a masked max that flags exactly
the rows a top-2 selection flags (core/acceptance.near_ties)."""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest

import drafter_models
import tiny_models
from mlxspec import cpu
from mlxspec.core.acceptance import EPS, NEAR_TIE_ULPS, near_ties
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.stats import GenerationStats
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import PerToken
from mlxspec.decoder import SpeculativeDecoder


def top2_rule(logits: mx.array, scores: mx.array) -> list[bool]:
    """The rule as written: top1 - top2 of the scores within the logits' rounding."""
    s = np.sort(np.array(scores.astype(mx.float32)), axis=-1)
    top = np.maximum(np.abs(np.array(mx.max(logits, axis=-1).astype(mx.float32))), 1.0)
    eps = NEAR_TIE_ULPS * EPS[str(logits.dtype).rpartition(".")[2]]
    return list(s[:, -1] - s[:, -2] <= eps * top)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_near_ties_by_a_masked_max_equal_the_top_2_rule(dtype):
    rng = np.random.default_rng(7)
    rows = (rng.normal(size=(48, 301)) * 4).astype(np.float32)
    thr = NEAR_TIE_ULPS * EPS[dtype]
    for i in range(0, 48, 4):  # planted: an exact tie (the max twice), half the threshold, twice it, -inf
        top = float(rows[i: i + 3].max())
        j, m = int(rng.integers(301)), top + 1.0 + 4 * thr * abs(top)  # clear of the random entries
        rows[i, j], rows[i, (j + 5) % 301] = m, m
        rows[i + 1, j], rows[i + 1, (j + 9) % 301] = m, m - thr * max(abs(m), 1) / 2
        rows[i + 2, j], rows[i + 2, (j + 9) % 301] = m, m - thr * max(abs(m), 1) * 2
        rows[i + 3, : 150] = -np.inf
    logits = mx.array(rows).astype(getattr(mx, dtype))
    scores = logits.astype(mx.float32)
    got = near_ties(logits, scores).tolist()
    assert got == top2_rule(logits, scores)
    assert got == near_ties(logits, scores, mx.argmax(scores, axis=-1)).tolist()  # with the caller's argmax
    assert sum(got) >= 24  # the exact and half-threshold ties are found; twice the threshold is not
    assert not any(got[i + 2] for i in range(0, 48, 4))


def _verify_normalisations(monkeypatch) -> list:
    """Patch the normalising pass: record each one a verify round (decoder._chain_round,
    trees/round.run_tree_round) asks for itself (the drafters' own are not counted)."""
    calls, real = [], cpu.normalise

    def counting(x):
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename.endswith(("sampling.py", "functools.py")):
            f = f.f_back  # process_logits, normalise: who called them
        if f is not None and f.f_code.co_name in ("_chain_round", "run_tree_round"):
            calls.append(tuple(x.shape))
        return real(x)

    monkeypatch.setattr(cpu, "normalise", counting)
    return calls


@pytest.mark.parametrize("tree", [False, None], ids=["chains", "trees"])
def test_a_greedy_round_pays_no_normalising_pass_unless_logprobs_are_asked(monkeypatch, tree):
    cfg = tiny_models.config_for("llama")
    target = tiny_models.build(cfg, seed=11, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=5)
    prompt = [7, 19, 200, 31, 31, 5]
    plain = [t for t, _ in SpeculativeDecoder(target).generate(list(prompt), max_tokens=20)]
    calls = _verify_normalisations(monkeypatch)
    stats = GenerationStats()
    dec = SpeculativeDecoder(target, drafter_models.make("model", target, draft), PerToken(assumed(0.05), 6),
                             tree=tree)
    got = [t for t, _ in dec.generate(list(prompt), SamplingParams(), max_tokens=20, stats=stats)]
    assert got == plain and stats.draft_accepted > 0 and stats.target_passes < 20
    assert calls == []  # the old rounds normalised every verified row: [(k + 1, V), ...]
    # asked for log-probabilities, the emitted rows are normalised where they are read
    out = list(dec.generate(list(prompt), SamplingParams(), max_tokens=20, logprobs=2))
    assert [t for t, *_ in out] == plain and calls == []
    full = mx.concatenate([mx.array(prompt), mx.array(plain)])
    ref = target(full[None])[0, len(prompt) - 1: -1].astype(mx.float32)
    ref = ref - mx.logsumexp(ref, axis=-1, keepdims=True)
    for i, (tok, _, (lp, top)) in enumerate(out):
        assert lp == pytest.approx(ref[i, tok].item(), abs=2e-4)
        assert top[0][0] == tok and len(top) == 2
