"""The acceptance rule: which drafted tokens the target keeps, and what comes next.

Given k drafted tokens x_1..x_k, the draft distributions q_i they were sampled
from, and the target distributions p_0..p_k from one verify pass (row i is the
target's distribution for the position of x_{i+1}; row k is the bonus
position after all drafts):

* greedy: x_i is kept iff it is the target's argmax; the next token is the
  target's argmax at the first mismatch (or at the bonus position);
* exact speculative sampling (Leviathan et al. 2022, Chen et al. 2023): keep x_i
  with probability min(1, p(x_i)/q(x_i)); at the first rejection sample from
  norm(max(0, p - q)); if all k are kept, sample the bonus token from p_k.
  The output distribution is exactly p, whatever q is.

A drafter that proposes tokens deterministically (prompt lookup) has q = one-hot
(pass q=None): then x is kept with probability p(x), and the residual is p with
x removed.

Everything here is lazy MLX; the caller evaluates the result together with the
target's forward pass, as one graph.
"""

from __future__ import annotations

import mlx.core as mx

from .. import cpu
from .sampling import SamplingParams


def _q_at(q: mx.array | None, draft: mx.array) -> mx.array:
    if q is None:
        return mx.ones(draft.shape, dtype=mx.float32)
    return mx.take_along_axis(q, draft[:, None], axis=-1)[:, 0]


def acceptance_probability(p: mx.array, q: mx.array | None, draft: mx.array) -> mx.array:
    """min(1, p(x)/q(x)) for each drafted token: p, q are (k, V) probabilities."""
    px = mx.take_along_axis(p, draft[:, None], axis=-1)[:, 0]
    qx = _q_at(q, draft)
    return mx.minimum(1.0, px / mx.maximum(qx, 1e-30))


def residual(p: mx.array, q: mx.array | None, draft: mx.array) -> mx.array:
    """norm(max(0, p - q)) per row, (k, V).  A row where p <= q everywhere (so
    rejection has probability zero there) falls back to p, to stay a distribution."""
    if q is None:
        q = (mx.arange(p.shape[-1])[None, :] == draft[:, None]).astype(p.dtype)
    r = mx.maximum(p - q, 0.0)
    total = r.sum(axis=-1, keepdims=True)
    return mx.where(total > 0, r / mx.maximum(total, 1e-30), p)


# Near-ties (greedy): speculative greedy output is the target's argmax as its verify pass
# computes it.  A pass over several positions need not round as a one-position step does
# (another summation order), so against one-position decoding the output can differ only
# where the two best logits are within the dtype's rounding of each other.  A row is a
# near-tie when   top1 - top2 <= NEAR_TIE_ULPS * EPS[dtype] * max(|top logit|, 1),
# EPS the dtype's machine epsilon (the spacing of numbers in [1, 2)), dtype and top logit
# those of the raw logits the model produced, top1 - top2 measured on the scores the argmax
# is taken of.  The runtime counts near-ties on the positions it emits (stats.near_ties).
EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
NEAR_TIE_ULPS = 8


def near_tie_threshold(dtype, top: float) -> float:
    """How close the two best logits of a row computed in `dtype` (an mx.Dtype or its
    name) with top logit `top` must be to count as a near-tie."""
    name = str(dtype).rpartition(".")[2]
    return NEAR_TIE_ULPS * EPS.get(name, EPS["float32"]) * max(abs(float(top)), 1.0)


def near_ties(logits: mx.array, scores: mx.array, best: mx.array | None = None) -> mx.array:
    """Lazy (N,) bool: rows of `scores` (what the argmax is taken of, (N, V)) whose two
    best values are within the rounding of `logits` (the raw (N, V) logits, in the
    model's dtype): see NEAR_TIE_ULPS.  `best`: the rows' argmax, where the caller has
    it.  The runner-up is the largest score once the argmax's own entry is masked (an
    equal value elsewhere is a tie of gap 0): two max passes over the vocabulary, a
    third of what a top-2 selection costs on the CPU backend (7.0 against 2.7 ms for
    6 rows of 151,936)."""
    name = str(logits.dtype).rpartition(".")[2]
    eps = NEAR_TIE_ULPS * EPS.get(name, EPS["float32"])
    if scores.shape[-1] < 2:
        return mx.zeros(scores.shape[:-1], dtype=mx.bool_)
    s = scores.astype(mx.float32)
    best = mx.argmax(s, axis=-1) if best is None else best
    first = mx.take_along_axis(s, best[:, None], axis=-1)[:, 0]
    second = mx.max(mx.where(mx.arange(s.shape[-1]) == best[:, None], -mx.inf, s), axis=-1)
    top = mx.abs(first) if scores is logits else mx.abs(mx.max(logits, axis=-1).astype(mx.float32))
    return first - second <= eps * mx.maximum(top, 1.0)


def verify(target_logprobs: mx.array, draft: mx.array, q: mx.array | None,
           params: SamplingParams, key: mx.array | None):
    """Lazy verify of k drafts against k+1 target rows.

    Returns (accepted (k,) bool, next_tokens (k+1,)): the caller keeps the
    leading run of accepted drafts, n of them, then emits next_tokens[n].  Greedy
    params take the argmax, so any rows with the same argmax serve as
    `target_logprobs` (sampling.greedy_scores: the processed logits, not normalised).
    """
    k = draft.shape[0]
    if params.greedy:
        best = mx.argmax(target_logprobs, axis=-1)
        return best[:k] == draft, best
    k_accept, k_next = mx.random.split(key)
    p = cpu.probabilities(target_logprobs)
    if k == 0:
        return mx.zeros((0,), dtype=mx.bool_), mx.random.categorical(target_logprobs, key=k_next)
    u = mx.random.uniform(shape=(k,), key=k_accept)
    accepted = u < acceptance_probability(p[:k], q, draft)
    fallback = mx.concatenate([mx.log(residual(p[:k], q, draft)), target_logprobs[k:]], axis=0)
    return accepted, mx.random.categorical(fallback, key=k_next)


def verify_coupled(target_logprobs: mx.array, draft: mx.array, coupling, start: int):
    """Coupled sampling (core/coupled.py): row i is position start + i; the target's
    choice there is argmax(log p + g); a draft is kept iff it equals that choice (the
    greedy rule on perturbed log-probabilities).  Same return as `verify`."""
    k = draft.shape[0]
    best = coupling.choose(target_logprobs, range(start, start + k + 1))
    return best[:k] == draft, best


def leading_accepted(accepted: list[bool]) -> int:
    n = 0
    while n < len(accepted) and accepted[n]:
        n += 1
    return n
