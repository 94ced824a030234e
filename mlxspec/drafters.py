"""Drafters: where the guesses come from.

The speculative loop does not care how tokens are proposed.  A drafter gets the
token history and a number k, and returns up to k tokens plus, for sampling,
the distributions q it drew them from (processed by the same `process_logits`
as the target).  A drafter that proposes deterministically returns q=None.

* `ModelDrafter`: a small model with its own KV cache (optionally stopping early
  when its top probability falls below `p_min`, as llama.cpp's --draft-p-min).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .cache import ModelState
from .sampling import SamplingParams, process_logits, sample


@dataclass
class Proposal:
    tokens: list[int]
    q: mx.array | None = None  # (len(tokens), V) probabilities; None = deterministic

    def __len__(self):
        return len(self.tokens)


EMPTY = Proposal([])


class Drafter:
    """Interface.  `propose` must not change what the target sees; `prefill` lets
    a drafter with a cache process the prompt up front (counted as prompt time)."""

    name = "none"
    max_k = 0

    def prefill(self, history: list[int]) -> None:
        pass

    def propose(self, history: list[int], k: int, params: SamplingParams, key) -> Proposal:
        return EMPTY

    def reset(self) -> None:
        pass


class ModelDrafter(Drafter):
    name = "draft-model"
    max_k = 16

    def __init__(self, model, p_min: float = 0.0):
        self.state = ModelState(model)
        self.p_min = p_min

    def prefill(self, history):
        self.state.prefill(history)

    def reset(self):
        self.state.reset()

    def propose(self, history, k, params, key):
        if k <= 0:
            return EMPTY
        state = self.state
        pending = state.sync(history)
        keys = mx.random.split(key, k) if key is not None else [None] * k
        x = mx.array(pending, dtype=mx.uint32)
        tokens, qs, forwards = [], [], 0
        for i in range(k):
            logits = state.model(x.reshape(1, -1), cache=state.cache)[0, -1:]
            state.positions += x.size
            forwards += 1
            context = [history + [int(t.item()) for t in tokens]] if params.uses_context else None
            lp = process_logits(logits, params, context)
            tok = sample(lp, params, keys[i])
            if self.p_min > 0:
                if mx.exp(lp.max()).item() < self.p_min:
                    break  # too unsure: stop drafting; sync() trims the extra position
            elif params.uses_context:
                mx.eval(tok)
            else:
                mx.async_eval(tok)
            tokens.append(tok)
            qs.append(lp)
            x = tok
        if not tokens:
            state.tokens.extend(pending)
            return EMPTY
        mx.eval(tokens)
        out = [int(t.item()) for t in tokens]
        state.tokens.extend(pending + out[: forwards - 1])
        q = None if params.greedy else mx.exp(mx.concatenate(qs, axis=0))
        return Proposal(out, q)
