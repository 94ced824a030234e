"""Logits processing: the one function that turns a model's logits into the
distribution we sample from.

Speculative sampling is exact only if the target distribution p and the draft
distribution q go through *the same* processing, so both models' logits pass
through `process_logits` and nothing else.  Order (as Hugging Face and
llama.cpp's common sampler): on the raw logits, `logit_bias` (added), the
repetition penalty (the last `repetition_context_size` tokens of the context,
prompt included), OpenAI's presence and frequency penalties (logit -= presence *
[count > 0] + frequency * count, counted over the tokens generated so far, the
prompt excluded, as OpenAI and vLLM do), then a constraint's mask (a
`constraint` object, e.g. mlxspec/constrained/: tokens that would break a JSON
reply get -inf); then temperature, then top-k, top-p and min-p on the tempered
distribution, then renormalise.  temp == 0 means greedy: the distribution is a
point mass on the argmax of the processed logits.  The context-dependent steps
read each row's own context (`contexts`), so a draft's rows and the target's
rows for the same prefix are processed alike.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field, fields

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
    presence_penalty: float = 0.0  # OpenAI's: logit -= presence * [token generated before]
    frequency_penalty: float = 0.0  # logit -= frequency * (times generated before)
    logit_bias: tuple = ()  # ((token id, bias -100..100), ...); a dict {id: bias} is taken too
    # Set by the decoder or a server, not by users: where the generated part of a context begins (the
    # penalties count, and a constraint reads, from there), and a constraint (mlxspec/constrained/)
    completion_start: int = field(default=0, repr=False)
    constraint: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        """Every field checked by core/options.py's rules: a bad one is a one-line BadValue (an MlxspecError)."""
        from .options import check, check_logit_bias

        for name in ("temp", "top_k", "top_p", "min_p", "repetition_penalty", "repetition_context_size", "seed",
                     "sampling", "presence_penalty", "frequency_penalty"):
            object.__setattr__(self, name, check(name, getattr(self, name)))
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))

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
        """Processing reads each row's context (a penalty or a constraint)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.constraint is not None)

    @property
    def adjusts_logits(self) -> bool:
        """Anything is done to the raw logits before temperature (a pruned draft head's greedy
        shortcut, which skips processing, is then not taken)."""
        return self.uses_context or bool(self.logit_bias)

    def to_dict(self) -> dict:
        """The user's settings (what a Session saves); not the decoder's start or a constraint."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("completion_start", "constraint")}
        d["logit_bias"] = {str(t): b for t, b in self.logit_bias}
        return d


def apply_repetition_penalty(logits: mx.array, context: list[int], penalty: float) -> mx.array:
    """CTRL-style penalty on one row (V,): positive logits of recent tokens are
    divided by `penalty`, negative ones multiplied."""
    if not context or penalty == 1.0:
        return logits
    idx = mx.array(sorted(set(context)))
    sel = logits[idx]
    return logits.at[idx].add(mx.where(sel < 0, sel * penalty, sel / penalty) - sel)


def apply_openai_penalties(logits: mx.array, generated: list, presence: float, frequency: float) -> mx.array:
    """OpenAI's presence and frequency penalties on (N, V) logits: row i's `generated[i]` is the
    tokens it has generated so far (logit -= presence * [count > 0] + frequency * count)."""
    rows, cols, vals = [], [], []
    for i, toks in enumerate(generated):
        for t, c in Counter(toks).items():
            if 0 <= t < logits.shape[-1]:
                rows.append(i)
                cols.append(t)
                vals.append(presence + frequency * c)
    if not rows:
        return logits
    return logits.at[mx.array(rows), mx.array(cols)].add(-mx.array(vals, dtype=mx.float32))


def apply_logit_bias(logits: mx.array, bias: tuple) -> mx.array:
    """OpenAI's logit_bias ((token id, bias), ...) added to every row; ids past the vocabulary are left out."""
    pairs = [(t, b) for t, b in bias if t < logits.shape[-1]]
    if not pairs:
        return logits
    row = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[mx.array([t for t, _ in pairs])].add(
        mx.array([b for _, b in pairs], dtype=mx.float32))
    return logits + row


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


def normalise(lp: mx.array) -> mx.array:
    """lp - logsumexp(lp) over the last axis (lazy)."""
    return cpu.normalise(lp)  # on the CPU backend in the kernel


def process_logits(logits: mx.array, params: SamplingParams, contexts=None) -> mx.array:
    """Logits (N, V) -> log-probabilities (N, V) of the distribution to sample from.

    `contexts[i]` is the token history seen by row i (the repetition penalty reads
    its last `repetition_context_size` tokens; the presence and frequency penalties
    and a constraint, its tokens from `params.completion_start` on; ignored when
    nothing reads it).  For greedy params the result is the processed logits,
    normalised; take its argmax (or take it of `greedy_scores`, the same logits not
    normalised: a greedy choice needs no normalising pass over the vocabulary).
    """
    if params.greedy:
        return normalise(greedy_scores(logits, params, contexts))
    return _sampling_logprobs(_processed(logits, params, contexts), params)


def greedy_scores(logits: mx.array, params: SamplingParams, contexts=None) -> mx.array:
    """The processed logits (N, V), float32, not normalised: what a greedy choice takes
    the argmax of.  `process_logits` for greedy params is these, normalised; a
    normalising pass costs a logsumexp over every row of the vocabulary (MLX's own op on
    the CPU backend: 11 ms for 6 rows of 151,936; the Linux CPU kernel's 0.4 ms), and subtracting one number from a row never changes
    which entry is largest, so greedy verification skips it (the target's argmax is
    taken of its own logits, as mlx-lm's argmax of logits - logsumexp picks it except
    where rounding ties two entries, which near_ties counts)."""
    assert params.greedy
    return _processed(logits, params, contexts)


def lazy_normalised(scores: mx.array):
    """`normalise(scores)`, made only when called: a greedy round's log-probabilities,
    which only `generate(logprobs=...)` reads (token_logprobs calls it)."""
    return functools.partial(normalise, scores)


def _processed(logits: mx.array, params: SamplingParams, contexts) -> mx.array:
    """The logits with the bias, penalties and constraint applied (float32)."""
    logits = logits.astype(mx.float32)
    if params.logit_bias:
        logits = apply_logit_bias(logits, params.logit_bias)
    if params.uses_context and contexts is not None:
        if params.repetition_penalty != 1.0:
            n = params.repetition_context_size
            rows = [
                apply_repetition_penalty(logits[i], list(contexts[i][-n:]), params.repetition_penalty)
                for i in range(logits.shape[0])
            ]
            logits = mx.stack(rows)
        generated = [list(c[params.completion_start:]) for c in contexts]
        if params.presence_penalty or params.frequency_penalty:
            logits = apply_openai_penalties(logits, generated, params.presence_penalty, params.frequency_penalty)
        if params.constraint is not None:  # -inf where a token would break the constraint
            logits = logits + params.constraint.mask(generated, logits.shape[-1])
    return logits


def _sampling_logprobs(logits: mx.array, params: SamplingParams) -> mx.array:
    """Processed logits -> the log-probabilities to sample from (temperature, top-k,
    top-p, min-p)."""
    lp = normalise(logits / params.temp)
    lp = _top_k(lp, params.top_k)
    lp = _top_p(normalise(lp), params.top_p) if params.top_p < 1.0 else lp
    lp = _min_p(lp, params.min_p)
    return normalise(lp)


LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a token the processing ruled out (JSON has no -inf)


def token_logprobs(logprobs: mx.array, rows: list, tokens: list, top: int) -> list:
    """For each emitted token: (its log-probability in row rows[j] of the processed (N, V)
    `logprobs`, [(id, log-probability), ...] of the row's `top` most likely tokens, best first).
    `logprobs` may be a function that makes them (a greedy round normalises only when asked)."""
    if callable(logprobs):
        logprobs = logprobs()
    sel = logprobs[mx.array(rows)] if rows else logprobs[:0]
    chosen = mx.take_along_axis(sel, mx.array(tokens)[:, None], axis=-1)[:, 0]
    best = mx.argsort(-sel, axis=-1)[:, :top] if top > 0 else None
    vals = mx.take_along_axis(sel, best, axis=-1) if top > 0 else None
    mx.eval(chosen, *([best, vals] if top > 0 else []))
    floor = lambda x: max(float(x), LOGPROB_FLOOR)  # noqa: E731
    out = []
    for j, c in enumerate(chosen.tolist()):
        tops = list(zip(best[j].tolist(), map(floor, vals[j].tolist()))) if top > 0 else []
        out.append((floor(c), tops))
    return out


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
