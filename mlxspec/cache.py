"""A model with its KV cache and the exact list of tokens the cache holds.

Keeping the token list beside the cache makes every rollback one rule: to
continue from a token history, keep the longest common prefix of what the cache
holds and the history (never the whole history: the last token is always fed
again, since its logits are needed), trim the rest, and feed what is missing.
That covers rejected drafts, the draft model not having seen its own last
token after a fully accepted round, generations that stop mid-round (EOS,
max tokens, Ctrl-C) and multi-turn chat, where a new turn reuses the cached
conversation and feeds only the new message.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from . import progress
from .errors import MlxspecError

PREFILL_STEP = 512


def check_trimmable(model, name="model"):
    cache = make_prompt_cache(model)
    if not can_trim_prompt_cache(cache):
        kinds = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        raise MlxspecError(
            f"{name} uses a KV cache that cannot be rolled back ({', '.join(kinds)}): "
            "speculative decoding needs attention-only models (no SSM/hybrid layers); use --no-draft"
        )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ModelState:
    def __init__(self, model):
        self.model = model
        self.cache = make_prompt_cache(model)
        self.tokens: list[int] = []
        self.positions = 0  # forward positions computed, for tests and stats

    def sync(self, history: list[int]) -> list[int]:
        """Roll the cache back to the longest usable prefix of `history`; return
        the tokens still to feed (at least one)."""
        if not history:
            raise ValueError("empty token history")
        self._reconcile()
        keep = min(common_prefix(self.tokens, history), len(history) - 1)
        if keep < len(self.tokens):
            trim_prompt_cache(self.cache, len(self.tokens) - keep)
            del self.tokens[keep:]
        return history[keep:]

    def _reconcile(self):
        """An exception between a forward and its bookkeeping (Ctrl-C inside a draft
        step) can leave the cache holding positions the token list does not name:
        drop them, so trimming stays exact."""
        offset = getattr(self.cache[0], "offset", None) if self.cache else None
        if offset is None or offset == len(self.tokens):
            return
        if offset > len(self.tokens):
            trim_prompt_cache(self.cache, offset - len(self.tokens))
        else:
            self.reset()

    def forward(self, tokens) -> mx.array:
        """Logits (T, V) for `tokens`, appended to the cache.  A list of ids is
        recorded in `self.tokens`; a lazy mx.array (a draft model feeding its own
        samples) is not -- its caller records the ids once they are evaluated."""
        lazy = isinstance(tokens, mx.array)
        x = tokens if lazy else mx.array(tokens, dtype=mx.uint32)
        logits = self.model(x.reshape(1, -1), cache=self.cache)[0]
        if not lazy:
            self.tokens.extend(tokens)
        self.positions += x.size
        return logits

    def prefill(self, history: list[int], should_stop=None) -> list[int]:
        """Feed all but the last token of what the cache lacks, in chunks (checking
        `should_stop` between chunks, so a long prompt can be cancelled)."""
        pending = self.sync(history)
        with progress.prefill(len(pending) - 1) as report:  # a bar on a terminal (progress.py)
            while len(pending) > 1 and not (should_stop is not None and should_stop()):
                chunk = pending[: min(PREFILL_STEP, len(pending) - 1)]
                self.forward(chunk)
                mx.eval([c.state for c in self.cache])
                pending = pending[len(chunk):]
                report(len(chunk))
        return pending

    def reset(self):
        self.cache = make_prompt_cache(self.model)
        self.tokens = []
