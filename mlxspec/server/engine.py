"""`mlxspec serve`: up to N generations at a time on the device, from a bounded queue.

The engine keeps up to `parallel` slots (server/scheduler.py), each ONE
`SpeculativeDecoder` for the server's lifetime, so the target's and the draft's
KV caches keep whatever prefix the next request shares: `ModelState.sync` trims
both to the longest common prefix and feeds only the rest (a follow-up chat turn
costs its new message when it lands on its conversation's slot, which the engine
prefers; `prompt_tokens_processed` in the stats says how many prompt tokens were
fed).  The prompt is the chat template tokenized afresh from the request's
messages, so a reply depends on the request alone: it equals a fresh server's and
`mlxspec generate`'s, whatever else runs beside it.

`run_forever` runs in the main thread (MLX is used from that thread only): it
admits queued jobs to free slots and steps the running ones round-robin, one
draft/verify round each.  HTTP threads `submit` a `Job` and read its events:
("text", piece, from_draft) ... then ("done", stats, finish_reason) or ("error",
message).  A full queue is `QueueFull` (HTTP 429, with a Retry-After of about one
generation).  `Job.cancel()` (a client gone) ends its generation before its next
draft/verify round, the others untouched; a job cancelled while queued leaves
the queue at once (its place is free for the next client) and never runs.
"""

from __future__ import annotations

import collections
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from ..api import make_policy
from ..errors import MlxspecError
from ..core.sampling import SamplingParams
from .scheduler import Running, Slot, choose
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
    logprobs: int | None = None  # asked for: "text" events carry a 4th item, the tokens' (id, logprob, top)

    def cancel(self):
        if not self.cancelled.is_set():
            stats = self.stats
            self.passes_at_cancel = stats.target_passes if stats is not None else 0
            self.cancelled.set()
            if self.withdraw is not None:
                self.withdraw(self)


class Engine:
    def __init__(self, pair, decoder, num_draft, max_queue: int, parallel: int = 1, make_decoder=None):
        """`decoder`: the first slot's; `make_decoder()` makes the others' (up to `parallel` slots, each made
        when it is first needed; without it one slot serves every request)."""
        self.pair = pair
        self.num_draft = num_draft  # the server's setting, as given (None: auto)
        self.parallel = max(1, parallel) if make_decoder is not None else 1
        self.make_decoder = make_decoder
        self._cost = getattr(decoder.policy, "cost", None)  # the calibration, shared by every slot's auto policy
        self.slots = [Slot(self, decoder, 0)]
        self.active: list[Running] = []  # round-robin order
        self.waiting: collections.deque = collections.deque()  # queued jobs, oldest first
        self.cond = threading.Condition()
        self.max_queue = max_queue
        self.served = 0
        self.generated = 0  # tokens generated since start, every stream
        self.last: dict | None = None  # the last generation's outcome, for /health
        self.last_seconds = 1.0  # how long the last generation took (Retry-After)

    # the first slot's, as before --parallel (tests and callers that know one decoder)
    decoder = property(lambda self: self.slots[0].decoder)
    default = property(lambda self: self.slots[0].default)
    plain = property(lambda self: self.slots[0].plain)

    def cost(self):
        """The cost model for an auto policy: the server's calibration, measured once."""
        if self._cost is None:
            self._cost = getattr(make_policy(None, self.slots[0].default[0], self.pair), "cost", None)
        return self._cost

    @property
    def busy(self) -> bool:
        return bool(self.active)

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
        """About one generation's seconds (several streams share the device: each takes longer)."""
        return max(1, min(60, math.ceil(self.last_seconds / len(self.slots))))

    def queued(self) -> int:
        return len(self.waiting)

    def health(self) -> dict:
        active = list(self.active)
        return {"busy": bool(active), "active": len(active), "parallel": self.parallel, "queued": self.queued(),
                "max_queue": self.max_queue, "served": self.served, "last_generation": self.last,
                "streams": [r.describe() for r in active]}

    def stats(self) -> dict:
        """/stats: /health's figures, every slot's cache, and totals since start."""
        return {**self.health(), "generated_tokens": self.generated,
                "slots": [{"slot": s.index, "busy": s.running is not None, "cached_tokens": len(s.held())}
                          for s in list(self.slots)]}

    def run_forever(self):
        """Admit queued jobs to free slots, then give each running stream one round, in turn."""
        while True:
            if not self.active:
                with self.cond:  # a timeout, so Ctrl-C reaches this thread
                    self.cond.wait_for(lambda: self.waiting, timeout=0.5)
            self.sweep()

    def sweep(self):
        """One turn: queued jobs that find a free slot start, then every running stream does one round."""
        with self.cond:
            admitted = self._admit()
        for job, slot in admitted:
            self._start(job, slot)
        for r in list(self.active):
            self._step(r)

    def _admit(self) -> list:
        """(job, slot) for each queued job that gets a free slot now (the queue's lock held)."""
        out = []
        while self.waiting:
            job = self.waiting[0]
            if job.cancelled.is_set():  # cancelled as it was taken
                self.waiting.popleft()
                continue
            slot = self._slot_for(job.history, [s for _, s in out])
            if slot is None:
                break
            self.waiting.popleft()
            job.withdraw = None
            out.append((job, slot))
        return out

    def _slot_for(self, history: list, taken: list):
        """A free slot, preferring one whose cache holds this prompt's prefix (scheduler.choose); a
        new slot rather than trimming another conversation's cache, while there are fewer than N."""
        best = choose([s for s in self.slots if s not in taken], history)
        if len(self.slots) < self.parallel and (best is None or best.shared(history) < len(best.held())):
            best = Slot(self, self.make_decoder(), len(self.slots))
            self.slots.append(best)
        return best

    def _start(self, job: Job, slot: Slot):
        if job.cancelled.is_set():
            return
        try:
            r = Running(slot, job, self.pair)
        except BaseException as e:
            return self._fail(job, slot, None, e)
        self.active.append(r)

    def _step(self, r: Running):
        try:
            done = r.step()
        except BaseException as e:
            self.active.remove(r)
            return self._fail(r.job, r.slot, r, e)
        if done:
            self.active.remove(r)
            r.close()
            self.last_seconds = time.monotonic() - r.started
            self.served += 1
            self.generated += r.stream.stats.generated_tokens

    def run(self, job: Job):
        """One job to its end on the first slot, in the calling thread (no queue)."""
        slot = self.slots[0]
        try:
            r = Running(slot, job, self.pair)
            while not r.step():
                pass
            r.close()
        except BaseException as e:
            self._fail(job, slot, slot.running, e)

    def _fail(self, job: Job, slot: Slot, running, e: BaseException):
        """A generation that raised: its slot's caches are reset, its client gets the error, the others go on."""
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise e
        if isinstance(e, MlxspecError):
            message = str(e)
        else:  # a bug, or a panic in the model's tokenizer (pyo3's PanicException): the caches may be half-updated;
            # one line to the log, a 500 to the client, and the server goes on
            print(f"mlxspec serve: generation failed: {type(e).__name__}: {printable(str(e), 300)}",
                  file=sys.stderr, flush=True)
            message = f"internal error ({type(e).__name__}); the server reset its caches"
        try:
            if running is not None:
                running.close()
        except Exception:
            pass
        slot.restore()
        slot.running = None
        slot.reset()
        self.served += 1
        self.last = {"finish_reason": "error", "completion_tokens": 0, "rounds_after_cancel": None,
                     "error": message, "at": time.time()}
        job.events.put(("error", message))
