"""`mlxspec serve --parallel N`: the streams that decode together.

A `Slot` is one `SpeculativeDecoder` with its own KV caches, drafter and
draft-length policy; the slots of a server share only the pair's models (see
decoder.py: decoders of one pair share nothing else).  The engine (engine.py)
keeps up to N slots and gives each queued request a free one, preferring the slot
whose target cache already holds the longest prefix of the request's prompt (a
follow-up chat turn lands where its conversation is cached), else the emptiest,
least recently used one.

A `Running` is one request on its slot.  `step()` does one draft/verify round
(the first step also feeds the prompt) and hands out that round's text; the
engine steps the running streams round-robin, all on the one MLX thread, so each
stream's output is exactly what it would be alone (its own caches, its own rounds,
its own seeded noise: core/coupled.py keys the noise by seed and position only),
and a stream whose client hung up ends before its next round without touching the
others.

`default_parallel` sizes N by memory: as many full-context KV caches (target's
and draft's) as fit next to the loaded weights, at most `MAX_DEFAULT_PARALLEL`.
"""

from __future__ import annotations

import time

from ..api import GenerationStream, make_policy
from ..core.cache import common_prefix
from ..costs.draft_length import FixedK
from ..drafting.drafters import Drafter
from .responses import StopMatcher

MAX_DEFAULT_PARALLEL = 4
DEFAULT_CONTEXT = 4096  # a model that states no context length


def _weight_bytes(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters())) if model is not None else 0


def default_parallel(pair, max_kv_size: int | None = None, usable: int | None = None) -> tuple[int, str]:
    """(N, the rule in words): the number of full-context KV caches of the target and the
    draft that fit in the usable memory next to the loaded weights, between 1 and
    MAX_DEFAULT_PARALLEL."""
    from ..device import is_gpu, usable_memory_bytes
    from ..models.memory import kv_cache_bytes

    context = pair.context_length or DEFAULT_CONTEXT
    if max_kv_size is not None:
        context = min(context, max_kv_size)
    width = 2 if is_gpu() else 4  # the compute dtype's bytes (float32 on the CPU backend)
    per_stream = sum(kv_cache_bytes(c, context, width) for c in (pair.target_config, pair.draft_config) if c)
    usable = usable_memory_bytes() if usable is None else usable
    free = usable - _weight_bytes(pair.target) - _weight_bytes(pair.draft)
    fits = free // per_stream if per_stream else MAX_DEFAULT_PARALLEL
    n = int(max(1, min(MAX_DEFAULT_PARALLEL, fits)))
    return n, (f"{fits} KV caches of {context} tokens ({per_stream / 2**20:.0f} MiB each) fit next to the "
               f"weights; by default at most {MAX_DEFAULT_PARALLEL}")


class Slot:
    """One decoder, its server-default (drafter, policy), a plain pair, and an auto policy
    made on first use; `engine` supplies the cost model so no slot calibrates again."""

    def __init__(self, engine, decoder, index: int):
        self.engine = engine
        self.index = index
        self.decoder = decoder
        self.default = (decoder.drafter, decoder.policy)
        self.plain = (Drafter(), FixedK(0))
        self.auto_policy = decoder.policy if engine.num_draft in (None, "auto") else None
        self.running: Running | None = None
        self.last_used = 0.0  # time.monotonic() its last stream ended (0: never used)

    def held(self) -> list[int]:
        """The tokens the target's KV cache holds."""
        return self.decoder.target.tokens

    def shared(self, history: list[int]) -> int:
        return common_prefix(self.held(), history)

    def setup(self, num_draft) -> str | int:
        """Point the decoder at a request's drafter and policy; the setting in effect (for the stats)."""
        drafter, policy = self.default
        if num_draft is None:
            effective = "auto" if self.engine.num_draft is None else self.engine.num_draft
        elif num_draft == 0 or not drafter.max_k:
            drafter, policy, effective = *self.plain, 0
        elif num_draft == "auto":
            if self.auto_policy is None:
                self.auto_policy = make_policy(None, drafter, self.engine.pair, cost=self.engine.cost())
            policy, effective = self.auto_policy, "auto"
        else:
            policy, effective = FixedK(num_draft), num_draft
        if not drafter.max_k:
            effective = 0
        self.decoder.use(drafter, policy)  # a fixed k drafts chains (decoder.trees)
        return effective

    def restore(self):
        self.decoder.use(*self.default)

    def reset(self):
        """After a failed generation: the caches may be half-updated."""
        self.decoder.reset()
        for d, _ in (self.default, self.plain):
            d.reset()


class Running:
    """One job on one slot: `step()` runs a round and sends its text; True once the job is over
    (its "done" event sent; a failure raises, and the engine sends the "error")."""

    def __init__(self, slot: Slot, job, pair):
        self.slot, self.job = slot, job
        self.started = time.monotonic()
        self.stream = None
        self.effective = slot.setup(job.num_draft)
        slot.running = self
        self.stream = GenerationStream(slot.decoder, pair.tokenizer, list(job.history), job.params,
                                       job.max_tokens, should_stop=job.cancelled.is_set,
                                       eos_token_ids=pair.eos_token_ids, logprobs=job.logprobs)
        job.stats = self.stream.stats
        self.matcher = StopMatcher(job.stop, track=job.logprobs is not None)
        self.finish = None

    def step(self) -> bool:
        put, stream = self.job.events.put, self.stream
        stats = stream.stats
        while True:
            try:
                chunk = next(stream)
            except StopIteration:
                return self._end()
            for piece in self.matcher.feed(chunk.text, chunk.from_draft, chunk):
                put(("text", *piece))  # (text, from_draft[, logprob entries])
            if self.matcher.stopped:
                self.finish = "stop"
                return self._end()
            if len(stream.tokens) >= stats.tokens_speculative + stats.tokens_plain:
                return False  # the round's tokens are all out: the next one waits for this stream's next turn

    def _end(self) -> bool:
        job, stream = self.job, self.stream
        for piece in self.matcher.flush():
            job.events.put(("text", *piece))
        stream.close()
        stats = stream.stats
        finish = self.finish or stats.finish_reason or "length"
        if job.cancelled.is_set():
            finish = "cancelled"
        after = None if job.passes_at_cancel is None else stats.target_passes - job.passes_at_cancel
        self.slot.engine.last = {"finish_reason": finish, "completion_tokens": stats.generated_tokens,
                                 "rounds_after_cancel": after, "num_draft_tokens": self.effective}
        job.events.put(("done", stats, finish, self.effective))
        return True

    def close(self):
        """Free the slot (after the end or a failure)."""
        try:
            if self.stream is not None:
                self.stream.close()
        finally:
            self.slot.restore()
            self.slot.running = None
            self.slot.last_used = time.monotonic()

    def describe(self) -> dict:
        """For /health and /stats."""
        stats = self.stream.stats if self.stream is not None else None
        generated = len(self.stream.tokens) if self.stream is not None else 0
        return {"slot": self.slot.index, "prompt_tokens": len(self.job.history), "generated_tokens": generated,
                "max_tokens": self.job.max_tokens, "num_draft_tokens": self.effective,
                "target_passes": stats.target_passes if stats is not None else 0,
                "elapsed_s": round(time.monotonic() - self.started, 2)}


def choose(slots: list[Slot], history: list[int]) -> Slot | None:
    """The free slot whose cache shares the longest prefix with `history`; among equals, one
    whose cache would lose the fewest tokens, then the least recently used (other conversations stay
    cached).  None: no slot is free."""
    def key(s):
        shared = s.shared(history)
        return shared, shared - len(s.held()), -s.last_used

    free = [s for s in slots if s.running is None]
    return max(free, key=key) if free else None
