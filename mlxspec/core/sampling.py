"""Logits processing: the one function that turns a model's logits into the
distribution we sample from.

Speculative sampling is exact only if the target distribution p and the draft
distribution q go through *the same* processing, so both models' logits pass
through `process_logits` and nothing else.  Order (as Hugging Face and
llama.cpp's common sampler): repetition penalty on the raw logits, then
temperature, then top-k, top-p and min-p on the tempered distribution, then
renormalise.  temp == 0 means greedy: the distribution is a point mass on the
argmax of the penalised logits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import mlx.core as mx

from .. import cpu


@dataclass(frozen=True)
class SamplingParams:
    temp: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context_size: int = 20
    seed: int | None = None
    sampling: str | None = None  # "coupled" | "rejection"; None: coupled with a seed, else rejection (core/coupled.py)

    def __post_init__(self):
        """Every field checked by core/options.py's rules: a bad one is a one-line BadValue (an MlxspecError)."""
        from .options import check

        for name in ("temp", "top_k", "top_p", "min_p", "repetition_penalty", "repetition_context_size", "seed", "sampling"):
            object.__setattr__(self, name, check(name, getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    @property
    def coupled(self) -> bool:
        """Gumbel-coupled sampling (core/coupled.py): seeded output is the plain run's token for token."""
        if self.greedy:
            return False
        return self.sampling == "coupled" or (self.sampling is None and self.seed is not None)

    @property
    def uses_context(self) -> bool:
        return self.repetition_penalty != 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def apply_repetition_penalty(logits: mx.array, context: list[int], penalty: float) -> mx.array:
    """CTRL-style penalty on one row (V,): positive logits of recent tokens are
    divided by `penalty`, negative ones multiplied."""
    if not context or penalty == 1.0:
        return logits
    idx = mx.array(sorted(set(context)))
    sel = logits[idx]
    return logits.at[idx].add(mx.where(sel < 0, sel * penalty, sel / penalty) - sel)


def _top_k(lp: mx.array, k: int) -> mx.array:
    if k <= 0 or k >= lp.shape[-1]:
        return lp
    kth = mx.sort(lp, axis=-1)[..., -k][..., None]
    return mx.where(lp < kth, -mx.inf, lp)


def _top_p(lp: mx.array, top_p: float) -> mx.array:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    if top_p >= 1.0:
        return lp
    order = mx.argsort(-lp, axis=-1)
    sorted_lp = mx.take_along_axis(lp, order, axis=-1)
    probs = mx.exp(sorted_lp)
    mass_before = mx.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < top_p  # the token that crosses top_p is kept
    threshold = mx.min(mx.where(keep_sorted, sorted_lp, mx.inf), axis=-1, keepdims=True)
    return mx.where(lp < threshold, -mx.inf, lp)


def _min_p(lp: mx.array, min_p: float) -> mx.array:
    if min_p <= 0:
        return lp
    floor = mx.max(lp, axis=-1, keepdims=True) + math.log(min_p)
    return mx.where(lp < floor, -mx.inf, lp)


def _normalise(lp: mx.array) -> mx.array:
    return cpu.normalise(lp)  # lp - logsumexp(lp); on the CPU backend in the kernel


def process_logits(logits: mx.array, params: SamplingParams, contexts=None) -> mx.array:
    """Logits (N, V) -> log-probabilities (N, V) of the distribution to sample from.

    `contexts[i]` is the token history seen by row i (only the last
    `repetition_context_size` tokens are used; ignored without a penalty).
    For greedy params the result is the penalised logits, normalised; take its
    argmax.
    """
    logits = logits.astype(mx.float32)
    if params.uses_context and contexts is not None:
        n = params.repetition_context_size
        rows = [
            apply_repetition_penalty(logits[i], list(contexts[i][-n:]), params.repetition_penalty)
            for i in range(logits.shape[0])
        ]
        logits = mx.stack(rows)
    if params.greedy:
        return _normalise(logits)
    lp = _normalise(logits / params.temp)
    lp = _top_k(lp, params.top_k)
    lp = _top_p(_normalise(lp), params.top_p) if params.top_p < 1.0 else lp
    lp = _min_p(lp, params.min_p)
    return _normalise(lp)


def sample(logprobs: mx.array, params: SamplingParams, key: mx.array) -> mx.array:
    """One token per row of (N, V) processed log-probabilities."""
    if params.greedy:
        return mx.argmax(logprobs, axis=-1)
    return mx.random.categorical(logprobs, axis=-1, key=key)


def new_key(seed: int | None) -> mx.array:
    if seed is None:
        import random

        seed = random.SystemRandom().randrange(2**63)
    return mx.random.key(seed)
