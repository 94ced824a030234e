"""Hybrid drafting: prompt lookup first, the draft model after it.

Where the last few tokens occurred before (code being edited, a document being
quoted), the lookup continuation is free; the draft model then continues from
the end of it, or drafts alone where nothing matches (llama.cpp also gives the
model-free drafter priority).  Both sources ask the same `Round`, so the
per-token rule weighs a lookup token (free, acceptance of lookup drafts) and a
model token (a draft step, acceptance by the draft's confidence) alike.

Exactness: lookup tokens are deterministic given the history (q one-hot), model
tokens are drawn from the draft's q given the history and the lookup tokens
before them, so each position's proposal distribution is known exactly and the
ordinary acceptance rule keeps the output distribution the target's.
"""

from __future__ import annotations

import mlx.core as mx

from ..costs.draft_length import Round
from .drafters import EMPTY, Drafter, ModelDrafter, PromptLookupDrafter, Proposal


class HybridDrafter(Drafter):
    uses_draft_model = True
    proposes_lookup = True
    max_k = 16

    def __init__(self, lookup: PromptLookupDrafter, model: ModelDrafter):
        self.lookup, self.model = lookup, model
        self.relative_cost = model.relative_cost
        self.name = f"hybrid(lookup+{model.name})"
        self.cost_key = getattr(model, "cost_key", model.name)  # its draft step is the model's: one calibration

    def prefill(self, history, should_stop=None):
        self.lookup.prefill(history, should_stop)
        self.model.prefill(history, should_stop)

    def reset(self):
        self.lookup.reset()
        self.model.reset()

    def propose(self, history, k, params, key, rnd=None):
        if k <= 0:
            return EMPTY
        rnd = rnd if rnd is not None else Round(None, k)
        head = self.lookup.propose(history, k, params, None, rnd)
        tail = EMPTY
        if rnd.kept < k:
            tail = self.model.propose(history + head.tokens, k - len(head), params, key, rnd)
        if not head.tokens:
            return tail
        if not tail.tokens:
            return head
        q = None
        if tail.q is not None:  # sampling: the lookup rows are one-hot
            onehot = mx.arange(tail.q.shape[-1])[None, :] == mx.array(head.tokens)[:, None]
            q = mx.concatenate([onehot.astype(tail.q.dtype), tail.q], axis=0)
        return Proposal(head.tokens + tail.tokens, q, head.confidence + tail.confidence)
