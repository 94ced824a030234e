"""`mlxspec serve`: one generation at a time on the device, from a bounded queue.

The engine owns ONE `SpeculativeDecoder` for the server's lifetime, so the
target's and the draft's KV caches keep whatever prefix the next request
shares: `ModelState.sync` trims both to the longest common prefix and feeds only
the rest (a follow-up chat turn costs its new message; `prompt_tokens_processed`
in the stats says how many prompt tokens were fed).  The prompt is the chat
template tokenized afresh from the request's messages, so a reply depends on the
request alone: it equals a fresh server's and `mlxspec generate`'s.

`run_forever` runs in the main thread (MLX is used from that thread only); HTTP
threads `submit` a `Job` and read its events: ("text", piece, from_draft) ...
then ("done", stats, finish_reason) or ("error", message).  A full queue is
`QueueFull` (HTTP 429, with a Retry-After of about one generation).
`Job.cancel()` (a client gone) ends the generation before its next
draft/verify round; a job cancelled while queued leaves the queue at once (its
place is free for the next client) and never runs.
"""

from __future__ import annotations

import collections
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from ..api import GenerationStream, make_policy
from ..costs.draft_length import FixedK
from ..drafting.drafters import Drafter
from ..errors import MlxspecError
from ..core.sampling import SamplingParams
from .responses import StopMatcher
from ..util.untrusted import printable


class QueueFull(Exception):
    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after  # seconds: about one generation


@dataclass
class Job:
    history: list
    params: SamplingParams
    max_tokens: int
    stop: list
    num_draft: int | str | None
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    stats: object = None  # the running generation's GenerationStats
    passes_at_cancel: int | None = None
    withdraw: object = None  # the engine's, once queued: takes a cancelled job out of the queue

    def cancel(self):
        if not self.cancelled.is_set():
            stats = self.stats
            self.passes_at_cancel = stats.target_passes if stats is not None else 0
            self.cancelled.set()
            if self.withdraw is not None:
                self.withdraw(self)


class Engine:
    def __init__(self, pair, decoder, num_draft, max_queue: int):
        self.pair = pair
        self.decoder = decoder
        self.num_draft = num_draft  # the server's setting, as given (None: auto)
        self.default = (decoder.drafter, decoder.policy)
        self.plain = (Drafter(), FixedK(0))
        self.auto_policy = decoder.policy if num_draft in (None, "auto") else None
        self.waiting: collections.deque = collections.deque()  # queued jobs, oldest first
        self.cond = threading.Condition()
        self.max_queue = max_queue
        self.busy = False
        self.served = 0
        self.last: dict | None = None  # the last generation's outcome, for /health
        self.last_seconds = 1.0  # how long the last generation took (Retry-After)

    def submit(self, job: Job):
        with self.cond:
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"the server is busy: {self.max_queue} requests are already waiting; retry later",
                                self.retry_after())
            job.withdraw = self._withdraw
            self.waiting.append(job)
            self.cond.notify()

    def _withdraw(self, job: Job):
        """A queued job whose client left: out of the queue now, not when its turn comes."""
        with self.cond:
            try:
                self.waiting.remove(job)
            except ValueError:
                return  # already running (the generation stops itself) or done
        self.last = {"finish_reason": "cancelled", "completion_tokens": 0, "rounds_after_cancel": 0}

    def retry_after(self) -> int:
        return max(1, min(60, math.ceil(self.last_seconds)))

    def queued(self) -> int:
        return len(self.waiting)

    def health(self) -> dict:
        return {"busy": self.busy, "queued": self.queued(), "max_queue": self.max_queue,
                "served": self.served, "last_generation": self.last}

    def run_forever(self):
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.waiting, timeout=0.5)  # a timeout, so Ctrl-C reaches this thread
                if not self.waiting:
                    continue
                job = self.waiting.popleft()
                job.withdraw = None
                if job.cancelled.is_set():  # cancelled as it was taken
                    continue
                self.busy = True
            start = time.monotonic()
            try:
                self.run(job)
            finally:
                self.last_seconds = time.monotonic() - start
                self.busy = False
                self.served += 1

    def _setup(self, num_draft) -> str | int:
        """Point the decoder at this request's drafter and policy; return the
        setting in effect (for the stats)."""
        drafter, policy = self.default
        if num_draft is None:
            effective = "auto" if self.num_draft is None else self.num_draft
        elif num_draft == 0 or not drafter.max_k:
            drafter, policy, effective = *self.plain, 0
        elif num_draft == "auto":
            if self.auto_policy is None:
                self.auto_policy = make_policy(None, drafter, self.pair)
            policy, effective = self.auto_policy, "auto"
        else:
            policy, effective = FixedK(num_draft), num_draft
        if not drafter.max_k:
            effective = 0
        self.decoder.use(drafter, policy)  # a fixed k drafts chains (decoder.trees)
        return effective

    def run(self, job: Job):
        effective = self._setup(job.num_draft)
        put = job.events.put
        stream = None
        finish = None
        try:
            stream = GenerationStream(self.decoder, self.pair.tokenizer, list(job.history), job.params,
                                      job.max_tokens, should_stop=job.cancelled.is_set,
                                      eos_token_ids=self.pair.eos_token_ids)
            job.stats = stream.stats
            matcher = StopMatcher(job.stop)
            for chunk in stream:
                for text, draft in matcher.feed(chunk.text, chunk.from_draft):
                    put(("text", text, draft))
                if matcher.stopped:
                    finish = "stop"
                    break
            for text, draft in matcher.flush():
                put(("text", text, draft))
            stream.close()
            stats = stream.stats
            finish = finish or stats.finish_reason or "length"
            if job.cancelled.is_set():
                finish = "cancelled"
            after = None if job.passes_at_cancel is None else stats.target_passes - job.passes_at_cancel
            self.last = {"finish_reason": finish, "completion_tokens": stats.generated_tokens,
                         "rounds_after_cancel": after, "num_draft_tokens": effective}
            put(("done", stats, finish, effective))
        except MlxspecError as e:
            self._failed(job, stream, str(e))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a bug, or a panic in the model's tokenizer (pyo3's PanicException): the caches
            # may be half-updated; one line to the log, a 500 to the client, and the server goes on
            print(f"mlxspec serve: generation failed: {type(e).__name__}: {printable(str(e), 300)}",
                  file=sys.stderr, flush=True)
            self._failed(job, stream, f"internal error ({type(e).__name__}); the server reset its caches")
        finally:
            self.decoder.use(*self.default)

    def _failed(self, job: Job, stream, message: str):
        try:
            if stream is not None:
                stream.close()
        except Exception:
            pass
        self.decoder.reset()
        for d, _ in (self.default, self.plain):
            d.reset()
        self.last = {"finish_reason": "error", "completion_tokens": 0, "rounds_after_cancel": None,
                     "error": message, "at": time.time()}
        job.events.put(("error", message))
