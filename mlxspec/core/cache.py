"""A model with its KV cache and the exact list of tokens the cache holds.

Keeping the token list beside the cache makes every rollback one rule: to
continue from a token history, keep the longest common prefix of what the cache
holds and the history (never the whole history: the last token is always fed
again, since its logits are needed), trim the rest, and feed what is missing.
That covers rejected drafts, the draft model not having seen its own last
token after a fully accepted round, generations that stop mid-round (EOS,
max tokens, Ctrl-C) and multi-turn chat, where a new turn reuses the cached
conversation and feeds only the new message.  Recurrent layers (hybrid and
state-space models) cannot be trimmed; core/recurrent.py rolls them back to a
checkpoint under the same rule.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from ..util import progress
from ..errors import MlxspecError
from .kv_window import bounded
from .recurrent import Checkpoints, cached_positions, landing, roll_back, rollback_problem, split_point, state_arrays

PREFILL_STEP = 512
MERGE_LIMIT = 4  # without a cost model (cost_model.merge_limit)


def check_rollback(model, name="model"):
    """Refuse, in one line, a model whose cache cannot be rolled back exactly."""
    problem = rollback_problem(make_prompt_cache(model))
    if problem:
        raise MlxspecError(f"{name} cannot be rolled back exactly after a rejected draft: {problem}; "
                           "mlxspec supports attention layers (KV caches) and recurrent layers (array states)")


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
    def __new__(cls, model, *args, **kwargs):
        """A model may name the ModelState subclass that holds it (`model.mlxspec_state`): a target
        sharded over several processes sends each cache operation to its other ranks (distributed/)."""
        own = getattr(model, "mlxspec_state", None)
        return super().__new__(own if cls is ModelState and own is not None else cls)

    def __init__(self, model, max_kv_size: int | None = None, kv_quant: tuple[int, int] | None = None):
        self.model = model
        self.max_kv_size = max_kv_size  # None: full KV caches; N: attention bounded to N positions (core/kv_window.py)
        self.kv_quant = kv_quant  # (bits, group_size): full KV caches quantized after the prompt (quantize)
        self.positions = 0  # forward positions computed, for tests and stats
        self.refed = 0  # of which fed again after a recurrent rollback (core/recurrent.py)
        self.merge_limit = MERGE_LIMIT  # re-fed positions that ride along with new ones in one call
        self.compiled = None  # compiled_forward.CompiledForward: a draft model's compiled calls
        self.widths: list | None = None  # a list: every call's positions are appended (the decoder's round record)
        self.reset()

    def sync(self, history: list[int]) -> list[int]:
        """Roll the cache back to the longest usable prefix of `history`; return
        the tokens still to feed (at least one).  Recurrent layers go back to
        their newest checkpoint at or before that prefix, so what they lack is
        fed again with the rest (core/recurrent.py)."""
        keep, behind = self._usable(history)
        if behind:
            pos = roll_back(self.cache, self.checkpoints, keep)
            self.refed += keep - pos
            del self.tokens[pos:]
            self.fed = keep = pos
        elif self.checkpoints:
            self.checkpoints.prune()
        self.known = len(history)
        return history[keep:]

    def pending_count(self, history: list[int]) -> int:
        """`len(self.sync(history))` without syncing: how many positions the next
        forward would feed (re-fed ones included), the cache left as it is."""
        keep, behind = self._usable(history)
        return len(history) - (landing(self.cache, self.checkpoints, keep) if behind else keep)

    def _usable(self, history: list[int]) -> tuple[int, bool]:
        """The longest usable prefix of `history` (never all of it: its last token is
        fed again), and whether the cache holds more than that (a rollback is due)."""
        if not history:
            raise ValueError("empty token history")
        keep = min(common_prefix(self.tokens, history), len(history) - 1)
        # the cache may hold positions the token list does not name: an exception
        # between a forward and its bookkeeping (Ctrl-C inside a draft step)
        return keep, keep < max(len(self.tokens), self.fed, cached_positions(self.cache))

    def forward(self, tokens, width: int | None = None) -> mx.array:
        """Logits (T, V) for `tokens`, appended to the cache.  A list of ids is
        recorded in `self.tokens`; a lazy mx.array (a draft model feeding its own
        samples) is not -- its caller records the ids once they are evaluated.
        Re-fed history beyond `merge_limit` gets a call of its own (still one
        lazy graph), so that a checkpoint follows it (recurrent.split_point).
        `width`: pad the call to that many positions, where a wider pass costs less
        (cost_model.CostModel.pad_width), with copies of the last token; they are
        recorded like any token, so the rollback rule keeps one only where it is
        what the history really holds.  Only full KV caches are padded."""
        if isinstance(tokens, mx.array):
            return self._call(tokens)
        n = len(tokens)
        if width is not None and width > n and self.can_pad:
            return self.forward(list(tokens) + [tokens[-1]] * (width - n))[:n]
        cut = split_point(len(tokens), self.known - self.fed, self.merge_limit) if self.checkpoints else 0
        x = mx.array(tokens, dtype=mx.uint32)
        logits = mx.concatenate([self._call(x[:cut]), self._call(x[cut:])]) if cut else self._call(x)
        self.tokens.extend(tokens)
        return logits

    @property
    def can_pad(self) -> bool:
        """Padded positions cost only a trim here: no recurrent layers, no bounded window."""
        return not self.checkpoints and self.max_kv_size is None

    def _call(self, x: mx.array, tree=None) -> mx.array:
        """`tree`: a tree block's (positions, mask), for a compiled call (trees/attention.py)."""
        self.fed += x.size  # first: an interrupted call still counts as fed, and is rolled back
        if self.compiled is not None and self.compiled.takes(x.size):
            logits = self.compiled(x, tree)
        else:
            logits = self.model(x.reshape(1, -1), cache=self.cache)[0]
        if self.checkpoints:
            self.checkpoints.record(self.fed)
        self.positions += x.size
        if self.widths is not None:
            self.widths.append(x.size)
        return logits

    def prefill(self, history: list[int], should_stop=None) -> list[int]:
        """Feed all but the last token of what the cache lacks, in chunks (checking
        `should_stop` between chunks, so a long prompt can be cancelled)."""
        pending = self.sync(history)
        mark = self.checkpoints.mark()
        with progress.prefill(len(pending) - 1) as report:  # a bar on a terminal (util/progress.py)
            while len(pending) > 1 and not (should_stop is not None and should_stop()):
                chunk = pending[: min(PREFILL_STEP, len(pending) - 1)]
                self.forward(chunk)
                mx.eval(state_arrays(self.cache))
                self.checkpoints.thin(mark)
                pending = pending[len(chunk):]
                report(len(chunk))
        quantize(self.cache, self.kv_quant)
        return pending

    def reset(self):
        self.cache = bounded(make_prompt_cache(self.model), self.max_kv_size)
        self.tokens: list[int] = []
        self.fed = 0  # positions the cache holds; more than len(tokens) only mid-step
        self.known = 0  # the last synced history's length: positions below it are settled
        self.checkpoints = Checkpoints(self.cache)


def quantize(cache: list, kv_quant: tuple[int, int] | None) -> None:
    """mlx-lm's `--kv-bits B --kv-group-size G` with `quantized_kv_start` 0: once the
    prompt is in (all but its last token; mlx-lm computes it unquantized, then converts),
    each full `KVCache` becomes `to_quantized(G, B)`, in place, and every later position
    attends to quantized keys and values.  Each position's keys and values are quantized
    on their own (groups of G along the head dimension), so trimming and feeding again
    stores what one-by-one decoding stores: the one rollback rule holds as it is
    (tests/test_kv_quant.py).  A prompt of one token differs from mlx-lm there: mlx-lm
    computes its first step unquantized."""
    if kv_quant is None:
        return
    bits, group = kv_quant
    for i, c in enumerate(cache):
        if type(c) is KVCache:
            cache[i] = c.to_quantized(group_size=group, bits=bits)
