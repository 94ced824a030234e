"""A chat session for apps: one loaded pair, one conversation, caches kept across turns.

    import threading
    import mlxspec
    from mlxspec.session import Session

    session = Session(model="smollm2-135m", system="You are terse.", max_tokens=200)
    reply = session.send("Hi!", on_chunk=lambda c: print(c.text, end="", flush=True))
    print(reply.stats.summary())

    for chunk in session.stream("And then?"):   # the iterator form
        ...                                     # chunk.text, chunk.from_draft
    session.cancel()                            # from any thread: the reply ends within one round

Design:

* One `SpeculativeDecoder` for the session's lifetime, so the target's and the
  draft's KV caches persist across turns.  Each turn's prompt is the chat
  template over the whole conversation, but as *tokens* it is the exact token
  history of the conversation so far (what the model read and generated) plus
  the tokenized template text that follows it; `ModelState.sync` then keeps the
  cached prefix, so a new turn feeds only the new message (see
  `SessionStream.prompt_tokens_processed`).  Re-tokenizing the reply text would
  not do: BPE may spell the same text with other tokens than the model chose.
* Draft on/off swaps the decoder's drafter and policy; the target cache is
  shared, so toggling never re-processes the conversation on the target (the
  draft model catches up on what it missed when it is turned back on).
* `cancel()` (any thread) sets the turn's cancel flag, which the decoder checks
  between prefill chunks and before each draft/verify round, so the stream ends
  after at most the round in progress.  The flag is created the moment a turn
  takes the session (before the template is rendered or anything tokenized), so
  a cancel that arrives while the prompt is being prepared is not lost.
  An interrupted reply is KEPT in the conversation by default (as LM Studio and
  most chat UIs do: what the user saw stays); `Session(on_cancel="drop")`
  removes the whole turn (user message and partial reply) instead.  Either way
  the token history, the messages and the caches stay consistent: the next turn
  gives exactly what plain decoding of that history gives.
* One generation at a time: a second `stream()`/`send()` (or a `reset()`,
  setting change or `save()`) while a reply is in progress raises
  `MlxspecError` at once instead of blocking (non-blocking lock).  A stream
  holds the session until it is exhausted or closed (`close()`, `with`, or the
  stream being garbage-collected); one closed before its first chunk was asked
  for leaves the conversation untouched.
* Near the end of the model's context the session does not crash:
  `near_context_limit` turns true, a reply that runs into the limit ends with
  `finish_reason == "context"`, and a prompt that no longer fits raises
  `ContextFullError` (an `MlxspecError`) leaving the conversation unchanged, so
  the app can offer `reset()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .api import Chunk, GenerationStream, apply_chat_template, make_drafter, make_policy
from .draft_length import FixedK
from .drafters import Drafter
from .errors import MlxspecError
from .sampling import SamplingParams
from .session_file import load_session, session_to_dict, write_session_file
from .speculative import SpeculativeDecoder
from .stats import GenerationStats

CONTEXT_WARN_FRACTION = 0.85  # near_context_limit once the conversation uses this much of the context


class ContextFullError(MlxspecError):
    """The conversation no longer fits the model's context: reset it (or drop turns)."""


@dataclass
class Reply:
    text: str
    tokens: list
    stats: GenerationStats
    finish_reason: str | None  # "stop" (EOS), "length" (max tokens), "context", "cancelled", "error"

    @property
    def cancelled(self) -> bool:
        return self.finish_reason == "cancelled"


class SessionStats:
    """Running totals over a session's turns (one GenerationStats summed field by field)."""

    SUMMED = ("prompt_tokens", "prompt_tokens_processed", "generated_tokens", "draft_proposed", "draft_accepted",
              "target_passes", "tokens_speculative", "tokens_plain", "prompt_time", "draft_time", "verify_time",
              "generation_time")

    def __init__(self):
        self.turns = 0
        self.cancelled = 0
        self.total = GenerationStats(drafter="session")

    def add(self, s: GenerationStats):
        self.turns += 1
        self.cancelled += s.finish_reason == "cancelled"
        t = self.total
        for name in self.SUMMED:
            setattr(t, name, getattr(t, name) + getattr(s, name))
        for mine, theirs in ((t.proposed_by_position, s.proposed_by_position),
                             (t.accepted_by_position, s.accepted_by_position)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        t.k_history.extend(s.k_history)

    @property
    def prompt_tokens_reused(self) -> int:
        """Prompt tokens served from the KV cache instead of being processed again."""
        return self.total.prompt_tokens - self.total.prompt_tokens_processed

    def to_dict(self) -> dict:
        d = self.total.to_dict()
        d.pop("k_history", None)
        d.pop("notes", None)
        d.pop("finish_reason", None)
        d.pop("drafter", None)
        return {"turns": self.turns, "cancelled": self.cancelled, "prompt_tokens_reused": self.prompt_tokens_reused, **d}

    def summary(self) -> str:
        t = self.total
        lines = [
            f"turns: {self.turns} ({self.cancelled} interrupted)",
            f"generated: {t.generated_tokens} tokens in {t.generation_time:.2f} s ({t.generation_tps:.2f} tok/s), "
            f"{t.target_passes} target passes"
            + (f" ({t.tokens_per_pass:.2f} tokens/pass)" if t.draft_proposed else ""),  # without drafts: 1 less EOS
        ]
        if t.draft_proposed:
            by_pos = " ".join(f"{100 * a:.0f}%" for a in t.acceptance_by_position)
            lines.append(f"draft: {t.draft_accepted}/{t.draft_proposed} accepted ({100 * t.acceptance_rate:.1f}%); "
                         f"by position: {by_pos}")
            lines.append(f"time: draft {t.draft_time:.2f} s, verify {t.verify_time:.2f} s")
        else:
            lines.append("draft: nothing drafted yet")
        lines.append(f"prompt: {t.prompt_tokens} tokens over all turns, {t.prompt_tokens_processed} processed, "
                     f"{self.prompt_tokens_reused} reused from the KV cache ({t.prompt_time:.2f} s)")
        return "\n".join(lines)


def mean_accepted_length(stats: GenerationStats) -> float:
    """Mean number of draft tokens accepted per drafting round."""
    rounds = sum(1 for k in stats.k_history if k > 0)
    return stats.draft_accepted / rounds if rounds else 0.0


class SessionStream:
    """The iterator `Session.stream()` returns: Chunks as they are accepted.

    After the last chunk (or `close()`), `.reply` holds the text, tokens, stats and
    finish reason, and the session is free again.  `prompt_tokens` is the full
    token prompt of this turn, `prompt_tokens_processed` how many of them the
    target actually had to process (the rest came from the KV cache)."""

    def __init__(self, session: "Session", user_text: str, prompt_text: str, history: list[int],
                 gen: GenerationStream, cancel_event: threading.Event, on_chunk):
        self._session = session
        self._user_text = user_text
        self._prompt_text = prompt_text
        self._history = history
        self.prompt_tokens = list(history)
        self._gen = gen
        self._cancel = cancel_event
        self._on_chunk = on_chunk
        self._done = False
        self._started = False  # the decoder has been asked for a chunk
        self._exhausted = False
        self._finish_lock = threading.Lock()
        self.reply: Reply | None = None

    # -- results -----------------------------------------------------------
    @property
    def stats(self) -> GenerationStats:
        return self._gen.stats

    @property
    def text(self) -> str:
        return self._gen.text

    @property
    def tokens(self) -> list[int]:
        return self._gen.tokens

    @property
    def finish_reason(self) -> str | None:
        return self._gen.stats.finish_reason

    @property
    def prompt_tokens_processed(self) -> int:
        return self._gen.stats.prompt_tokens_processed

    @property
    def done(self) -> bool:
        return self._done

    # -- iteration ---------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self) -> Chunk:
        if self._done:
            raise StopIteration
        self._started = True
        try:
            chunk = next(self._gen)
        except StopIteration:
            self._exhausted = True
            self._finish(error=False)
            raise
        except BaseException:
            # An error (or a KeyboardInterrupt) inside the decoder may have left
            # a cache half-updated: drop the caches rather than trust them.
            self._finish(error=True)
            raise
        if self._on_chunk is not None:
            try:
                self._on_chunk(chunk)
            except BaseException:
                self.close()
                raise
        return chunk

    def cancel(self):
        """Ask the stream to stop after the round in progress (any thread)."""
        self._cancel.set()

    def close(self):
        """Stop now (from the consuming thread) and free the session; idempotent."""
        if self._done:
            return
        try:
            self._gen.close()
        finally:
            self._finish(error=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if not self._done:
                self.close()
        except Exception:
            pass

    def _finish(self, error: bool):
        with self._finish_lock:
            if self._done:
                return
            self._done = True
        s = self._session
        try:
            stats = self._gen.stats
            if error:
                stats.finish_reason = "error"
            elif stats.finish_reason is None:  # closed before the decoder finished
                stats.finish_reason = "cancelled"
            if error:
                s.decoder.reset()
            reply_tokens = self._history[len(self.prompt_tokens):]
            if self._exhausted:
                text = self._gen.text
            else:  # stopped early: the streaming detokenizer was not finalized
                text = s.tokenizer.decode(reply_tokens) if reply_tokens else ""
            self.reply = Reply(text, list(reply_tokens), stats, stats.finish_reason)
            if self._started:  # a stream closed before it ran leaves no trace
                s._commit_turn(self, text, stats)
        finally:
            s._active = None
            s._turn_cancel = None
            s._lock.release()


class Session:
    """A conversation with one loaded target/draft pair.  See the module docstring."""

    def __init__(self, pair=None, *, model=None, draft_model=None, no_draft: bool = False,
                 system: str | None = None, max_tokens: int = 512, draft: bool | None = None,
                 num_draft=None, p_min: float = 0.0, on_cancel: str = "keep", sampling=None, **sampling_kw):
        """`pair`: a loaded `mlxspec.Pair`; or `model`/`draft_model` specs to load one
        (as `mlxspec.load`).  `draft`: start with drafting on (default: when the pair
        has a draft).  `sampling`: a SamplingParams, or keyword arguments temp,
        top_p, top_k, min_p, repetition_penalty, repetition_context_size, seed."""
        if on_cancel not in ("keep", "drop"):
            raise ValueError("on_cancel must be 'keep' or 'drop'")
        if pair is None:
            from .loading import load

            pair = load(model, draft_model, no_draft=no_draft)
        self.pair = pair
        self.tokenizer = pair.tokenizer
        self.on_cancel = on_cancel
        self.max_tokens = max_tokens
        self.eos_token_ids = set(pair.eos_token_ids)
        self._params = sampling if isinstance(sampling, SamplingParams) else SamplingParams(**{**(sampling or {}), **sampling_kw})
        self._num_draft = num_draft
        self._p_min = p_min
        self._lock = threading.Lock()
        self._active: SessionStream | None = None
        self._turn_cancel: threading.Event | None = None  # the running turn's cancel flag (set under the lock)
        self.decoder = SpeculativeDecoder(pair.target, Drafter(), FixedK(0), pair.context_length, pair.vocab_size)
        self._plain = (self.decoder.drafter, self.decoder.policy)
        self._spec = None  # (drafter, policy), built when drafting is first turned on
        self._draft_on = False
        if draft is None:
            draft = pair.draft is not None
        if draft:
            self._set_draft(True)
        self._system = system or None
        self.messages: list[dict] = []  # user/assistant turns; the system prompt is kept apart
        self._tokens: list[int] = []  # the exact token history of the conversation
        self._token_text = ""  # the text those tokens spell (template + replies)
        self.last_stats: GenerationStats | None = None
        self.stats = SessionStats()

    # -- settings ----------------------------------------------------------
    @property
    def params(self) -> SamplingParams:
        return self._params

    def set_sampling(self, **kw):
        """Change sampling settings (temp, top_p, top_k, min_p, repetition_penalty,
        repetition_context_size, seed) for the following turns."""
        with self._exclusive("change settings"):
            self._params = dataclasses.replace(self._params, **kw)

    @property
    def temp(self) -> float:
        return self._params.temp

    @temp.setter
    def temp(self, value: float):
        self.set_sampling(temp=float(value))

    @property
    def has_draft_model(self) -> bool:
        return self.pair.draft is not None

    @property
    def draft(self) -> bool:
        """Whether replies are drafted.  Setting it keeps the target's cache."""
        return self._draft_on

    @draft.setter
    def draft(self, on: bool):
        with self._exclusive("switch drafting"):
            self._set_draft(bool(on))

    def _set_draft(self, on: bool):
        if on and self._spec is None:
            if self.pair.draft is None:
                raise MlxspecError("no draft model is loaded (load the pair with a draft to turn drafting on)")
            d = make_drafter(self.pair, "model", self._p_min)
            self._spec = (d, make_policy(self._num_draft, d, self.pair))
        self.decoder.drafter, self.decoder.policy = self._spec if on else self._plain
        self._draft_on = on

    @property
    def num_draft(self):
        return self._num_draft

    @num_draft.setter
    def num_draft(self, value):
        with self._exclusive("change the draft length"):
            self._num_draft = value
            if self._spec is not None:
                self._spec = (self._spec[0], make_policy(value, self._spec[0], self.pair))
                if self._draft_on:
                    self.decoder.policy = self._spec[1]

    @property
    def current_k(self) -> int:
        """Draft length the policy will use next (0 with drafting off)."""
        if not self._draft_on:
            return 0
        k = getattr(self.decoder.policy, "k", None)
        if isinstance(k, int):
            return k
        if self.last_stats and self.last_stats.k_history:
            return self.last_stats.k_history[-1]
        return 0

    @property
    def system(self) -> str | None:
        return self._system

    @system.setter
    def system(self, text: str | None):
        """Change the system prompt of the whole conversation (the next turn then
        processes the conversation again, since its very start changed)."""
        with self._exclusive("change the system prompt"):
            self._system = text or None

    # -- conversation --------------------------------------------------------
    @property
    def generating(self) -> bool:
        return self._turn_cancel is not None

    def conversation(self) -> list[dict]:
        """The messages as the chat template sees them (system prompt first)."""
        head = [{"role": "system", "content": self._system}] if self._system else []
        return head + [dict(m) for m in self.messages]

    @property
    def tokens(self) -> list[int]:
        """The conversation's token history (prompt templates and replies)."""
        return list(self._tokens)

    @property
    def context_length(self) -> int | None:
        return self.decoder.context_length

    @context_length.setter
    def context_length(self, n: int | None):
        self.decoder.context_length = n

    @property
    def context_used(self) -> int:
        return len(self._tokens)

    @property
    def context_left(self) -> int | None:
        return None if self.context_length is None else max(0, self.context_length - self.context_used)

    @property
    def near_context_limit(self) -> bool:
        """True once the conversation uses most of the context: offer a reset."""
        n = self.context_length
        return n is not None and self.context_used >= CONTEXT_WARN_FRACTION * n

    def reset(self, keep_system: bool = True):
        """Forget the conversation (and the KV caches)."""
        with self._exclusive("reset"):
            self.messages = []
            self._tokens, self._token_text = [], ""
            if not keep_system:
                self._system = None
            self.decoder.reset()
            if self._spec is not None:
                self._spec[0].reset()

    def cancel(self) -> bool:
        """Stop the reply in progress after the current draft/verify round.  Safe
        from any thread; returns False when nothing is being generated."""
        flag = self._turn_cancel  # one read: a turn that ends meanwhile just ignores the set
        if flag is None:
            return False
        flag.set()
        return True

    # -- generation ---------------------------------------------------------
    def render(self, messages: list[dict]) -> str:
        """The prompt text for `messages` (chat template, generation prompt added).
        A template that raises gives a one-line `ChatTemplateError` (an MlxspecError)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            return apply_chat_template(tok, messages, tokenize=False)
        # No chat template: a plain transcript the model can continue.
        bos = getattr(tok, "bos_token", None) or ""
        body = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
        return f"{bos}{body}Assistant:"

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def build_prompt(self, user_text: str) -> tuple[str, list[int]]:
        """(prompt text, prompt tokens) for the next turn.  The tokens start with
        the conversation's exact token history when the template text extends it."""
        text = self.render(self.conversation() + [{"role": "user", "content": user_text}])
        if self._tokens and text.startswith(self._token_text):
            return text, self._tokens + self._encode(text[len(self._token_text):])
        return text, self._encode(text)

    def stream(self, text: str, *, max_tokens: int | None = None,
               on_chunk: Callable[[Chunk], None] | None = None) -> SessionStream:
        """Start a reply to `text`; iterate the result for Chunks.  Raises
        MlxspecError if this session is already generating, ContextFullError if
        the conversation no longer fits the context, ChatTemplateError if the
        model's chat template refuses the conversation; each leaves the
        conversation unchanged."""
        if not self._lock.acquire(blocking=False):
            raise MlxspecError("this session is already generating a reply: wait for it, or cancel() it first")
        # The turn's cancel flag exists from here on, before the prompt is prepared:
        # cancel() from now on ends this reply, however early it comes.
        cancel_event = self._turn_cancel = threading.Event()
        try:
            max_tokens = self.max_tokens if max_tokens is None else max_tokens
            if max_tokens < 1:
                raise MlxspecError(f"max_tokens must be at least 1, got {max_tokens}")
            prompt_text, history = self.build_prompt(text)
            limit = self.context_length
            if limit is not None and len(history) >= limit:
                raise ContextFullError(
                    f"the conversation ({len(history)} tokens with this message) fills the model's context "
                    f"({limit} tokens): reset the session to start over")
            gen = GenerationStream(self.decoder, self.tokenizer, history, self._params, max_tokens,
                                   should_stop=cancel_event.is_set, eos_token_ids=self.eos_token_ids)
            s = SessionStream(self, text, prompt_text, history, gen, cancel_event, on_chunk)
            self._active = s
            return s
        except BaseException:
            self._turn_cancel = None
            self._lock.release()
            raise

    def send(self, text: str, *, max_tokens: int | None = None,
             on_chunk: Callable[[Chunk], None] | None = None) -> Reply:
        """Generate the whole reply (calling `on_chunk` for each Chunk) and return it."""
        s = self.stream(text, max_tokens=max_tokens, on_chunk=on_chunk)
        with s:
            for _ in s:
                pass
        return s.reply

    def _commit_turn(self, s: SessionStream, reply_text: str, stats: GenerationStats):
        """Called once per stream, under the session lock, when it ends."""
        self.last_stats = stats
        self.stats.add(stats)
        if stats.finish_reason == "cancelled" and self.on_cancel == "drop":
            return  # conversation and token history as before the turn; sync() trims the caches
        self.messages.append({"role": "user", "content": s._user_text})
        self.messages.append({"role": "assistant", "content": reply_text})
        self._tokens = s._history
        self._token_text = s._prompt_text + reply_text

    @contextlib.contextmanager
    def _exclusive(self, what: str):
        """Hold the session for a change; refuse (never wait) while a reply runs."""
        if not self._lock.acquire(blocking=False):
            raise MlxspecError(f"cannot {what} while a reply is being generated: wait for it, or cancel() it first")
        try:
            yield
        finally:
            self._lock.release()

    # -- persistence (the file format and its checks: session_file.py) -------
    def to_dict(self) -> dict:
        return session_to_dict(self)

    def save(self, path) -> Path:
        """Write the conversation, settings, token history and stats as JSON."""
        with self._exclusive("save"):
            data = self.to_dict()
        return write_session_file(path, data)

    @classmethod
    def load(cls, path, pair=None, **overrides) -> "Session":
        """A session restored from `save()`.  Without `pair`, the saved model paths
        are loaded.  `overrides` are Session keyword arguments (e.g. draft=False).
        Every field is checked: a bad file is a one-line MlxspecError naming it."""
        return load_session(cls, path, pair, **overrides)
