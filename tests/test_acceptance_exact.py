"""The acceptance rule's exact output distribution equals the target's p.

Computed, not sampled: for a drafted token x ~ q, the rule keeps x with
probability a(x) = acceptance_probability(p, q, x) and otherwise emits a token
from r = residual(p, q, x).  So P(out = y) = q(y) a(y) + sum_x q(x) (1 - a(x)) r_x(y),
built from the rule's own functions, must equal p(y) for every y."""

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.core import acceptance
from mlxspec.core.acceptance import acceptance_probability, residual, verify
from mlxspec.core.sampling import SamplingParams, process_logits
from stats_util import chi_square

V = 7


def exact_output(p: np.ndarray, q: np.ndarray | None) -> np.ndarray:
    """Exact output distribution of one speculative step, enumerating x."""
    pm = mx.array(p[None].repeat(V, 0), dtype=mx.float32)
    xs = mx.arange(V)
    if q is None:  # deterministic drafter: average over the proposed token is not defined;
        raise ValueError
    qm = mx.array(q[None].repeat(V, 0), dtype=mx.float32)
    a = np.array(acceptance_probability(pm, qm, xs))
    r = np.array(residual(pm, qm, xs))
    out = q * a
    out += ((q * (1 - a))[:, None] * r).sum(0)
    return out


def exact_output_deterministic(p: np.ndarray, x: int) -> np.ndarray:
    pm, xs = mx.array(p[None], dtype=mx.float32), mx.array([x])
    a = float(np.array(acceptance_probability(pm, None, xs))[0])
    r = np.array(residual(pm, None, xs))[0]
    out = (1 - a) * r
    out[x] += a
    return out


def random_dist(rng, zeros=0):
    p = rng.dirichlet(np.ones(V) * 0.7)
    if zeros:
        p[rng.choice(V, zeros, replace=False)] = 0
        p /= p.sum()
    return p


@pytest.mark.parametrize("seed", range(40))
def test_exact_distribution_random_p_q(seed):
    rng = np.random.default_rng(seed)
    p = random_dist(rng, zeros=seed % 3)
    q = random_dist(rng, zeros=(seed // 3) % 4)  # q with zeros where p is not
    np.testing.assert_allclose(exact_output(p, q), p, atol=1e-6)


def test_exact_when_p_equals_q_and_when_disjoint():
    rng = np.random.default_rng(0)
    p = random_dist(rng)
    np.testing.assert_allclose(exact_output(p, p.copy()), p, atol=1e-6)
    p = np.array([0.5, 0.5, 0, 0, 0, 0, 0])
    q = np.array([0, 0, 0.2, 0.3, 0.5, 0, 0])
    np.testing.assert_allclose(exact_output(p, q), p, atol=1e-6)


@pytest.mark.parametrize("x", range(V))
def test_exact_for_deterministic_proposals(x):
    """Prompt lookup proposes x with certainty (q = one-hot): still exactly p."""
    p = random_dist(np.random.default_rng(x), zeros=2)
    np.testing.assert_allclose(exact_output_deterministic(p, x), p, atol=1e-6)


PROCESSORS = [
    SamplingParams(temp=1.0),
    SamplingParams(temp=0.6),
    SamplingParams(temp=1.3, top_k=3),
    SamplingParams(temp=1.0, top_p=0.8),
    SamplingParams(temp=0.9, min_p=0.1),
    SamplingParams(temp=1.0, repetition_penalty=1.5),
    SamplingParams(temp=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
]


@pytest.mark.parametrize("params", PROCESSORS, ids=lambda p: str(p.to_dict()))
@pytest.mark.parametrize("seed", range(5))
def test_exact_with_each_logits_processor(params, seed):
    """p and q both go through process_logits (same context); the rule's output is p."""
    rng = np.random.default_rng(100 + seed)
    lt = mx.array(rng.normal(0, 2, (1, V)).astype(np.float32))
    ld = lt + mx.array(rng.normal(0, 1.5, (1, V)).astype(np.float32))
    ctx = [[1, 3, 3]]
    p = np.array(mx.exp(process_logits(lt, params, ctx)))[0].astype(np.float64)
    q = np.array(mx.exp(process_logits(ld, params, ctx)))[0].astype(np.float64)
    np.testing.assert_allclose(exact_output(p, q), p, atol=1e-6)


def np_reference(logits, params, ctx):
    """Straightforward numpy reference of the processing order (penalty, temp, top-k, top-p, min-p)."""
    x = logits.astype(np.float64).copy()
    for t in set(ctx[-params.repetition_context_size:]):
        x[t] = x[t] * params.repetition_penalty if x[t] < 0 else x[t] / params.repetition_penalty
    x = x / params.temp
    p = np.exp(x - x.max())
    p /= p.sum()
    keep = np.ones(V, bool)
    if params.top_k:
        keep &= p >= np.sort(p)[-params.top_k]
    p = np.where(keep, p, 0)
    p /= p.sum()
    if params.top_p < 1:
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        k2 = np.zeros(V, bool)
        k2[order[before < params.top_p]] = True
        p = np.where(k2, p, 0)
        p /= p.sum()
    if params.min_p:
        p = np.where(p >= params.min_p * p.max(), p, 0)
        p /= p.sum()
    return p


@pytest.mark.parametrize("params", PROCESSORS, ids=lambda p: str(p.to_dict()))
def test_processing_matches_numpy_reference(params):
    rng = np.random.default_rng(7)
    for _ in range(5):
        logits = rng.normal(0, 2, V).astype(np.float32)
        got = np.array(mx.exp(process_logits(mx.array(logits[None]), params, [[1, 3, 3]])))[0]
        np.testing.assert_allclose(got, np_reference(logits, params, [1, 3, 3]), atol=1e-6)


def test_verify_samples_from_p():
    """The sampling path (uniforms, residual draw, bonus draw) really follows the rule:
    draw x ~ q, run verify, and the first emitted token is distributed as p."""
    rng = np.random.default_rng(3)
    p, q = random_dist(rng, zeros=1), random_dist(rng, zeros=2)
    lp = mx.log(mx.array(np.stack([p, p]), dtype=mx.float32))
    qm = mx.array(q[None], dtype=mx.float32)
    params = SamplingParams(temp=1.0)
    counts, n = {}, 4000
    keys = mx.random.split(mx.random.key(0), n)
    xs = np.random.default_rng(4).choice(V, size=n, p=q)
    for i in range(n):
        acc, nxt = verify(lp, mx.array([int(xs[i])], dtype=mx.uint32), qm, params, keys[i])
        out = int(xs[i]) if acc.item() else nxt[0].item()
        counts[out] = counts.get(out, 0) + 1
    stat, df, pval = chi_square(counts, {i: p[i] for i in range(V) if p[i] > 0}, n)
    assert pval > 1e-3, (stat, df, counts, p)


def test_greedy_rule():
    lp = mx.log(mx.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]))
    acc, nxt = verify(lp, mx.array([1, 2], dtype=mx.uint32), None, SamplingParams(), None)
    assert acc.tolist() == [True, False] and nxt.tolist() == [1, 0, 2]
    assert acceptance.leading_accepted(acc.tolist()) == 1
