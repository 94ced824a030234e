"""A chat session for apps: one loaded pair, one conversation, caches kept across turns.

    import threading
    import mlxspec
    from mlxspec.session.session import Session

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
  removes the whole turn (user message and partial reply) instead.  A turn
  interrupted before its first reply token (while the message was still being
  processed) is always removed, so the next turn does not process it again.  Either way
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
import threading
import warnings
from pathlib import Path
from typing import Callable

from . import prompt as session_prompt
from ..api import Chunk, GenerationStream
from ..costs.draft_length import FixedK
from ..drafting.drafters import Drafter
from ..errors import MlxspecError
from ..core.sampling import SamplingParams
from .drafting import Drafting
from .settings import NO_TEMPLATE_SYSTEM, SessionSettingError, check_options, sampling_params
from .file_format import load_session, session_to_dict, write_session_file
from .totals import SessionStats, mean_accepted_length  # noqa: F401  (public names of this module)
from .turn import Reply, SessionStream  # noqa: F401
from ..decoder import SpeculativeDecoder
from ..core.stats import GenerationStats

CONTEXT_WARN_FRACTION = 0.85  # near_context_limit once the conversation uses this much of the context


class ContextFullError(MlxspecError):
    """The conversation no longer fits the model's context: reset it (or drop turns)."""


class Session:
    """A conversation with one loaded target/draft pair.  See the module docstring."""

    def __init__(self, pair=None, *, model=None, draft=None, no_draft: bool = False, drafter=None,
                 drafting: bool | None = None, system: str | None = None, max_tokens: int = 512,
                 num_draft=None, p_min: float = 0.0, on_cancel: str = "keep", sampling=None,
                 draft_model=None, tree: bool | None = None, max_kv_size: int | None = None,
                 chat_template: bool = True, num_draft_max=None, draft_vocab=None, cost_profile=None,
                 kv_bits: int | None = None, kv_group_size: int = 64, **sampling_kw):
        """`pair`: a loaded `mlxspec.Pair`; or `model` and `draft` (a draft MODEL, as in
        `mlxspec.load`; a catalog target brings its catalog partner) to load one.
        `drafter`: what drafts while drafting is on: 'model' (the default when the
        pair has a draft model), 'hybrid', 'lookup' (prompt n-grams, no draft model),
        'layerskip', 'none', or a Drafter.  `drafting`: start with drafting on
        (default: on when there is a drafter).  `sampling`: a SamplingParams, or
        keyword arguments temp, top_p, top_k, min_p, repetition_penalty,
        repetition_context_size, seed.  `tree`: None (default) verifies draft trees
        where the pair supports them, False verifies chains.  `max_kv_size`: bound the KV
        caches to that many positions (mlx-lm's --max-kv-size; the context limit stays
        the model's).  `chat_template=False`: no template, each message's raw text
        continues the conversation (session/prompt.py; no system prompt then).
        `num_draft_max`, `draft_vocab`, `cost_profile`: as in `mlxspec.generate` (the
        `auto` policy's cap, the pruned draft head, another machine's costs).  Every
        value is checked here: a bad one is a one-line MlxspecError before anything is loaded."""
        if isinstance(draft, bool):  # the old meaning of draft=: on/off
            warnings.warn("Session(draft=True/False) is now Session(drafting=True/False); draft= names a "
                          "draft model", DeprecationWarning, stacklevel=2)
            drafting, draft = draft, None
        if draft_model is not None:
            warnings.warn("Session(draft_model=...) is now Session(draft=...)", DeprecationWarning, stacklevel=2)
            draft = draft if draft is not None else draft_model
        check_options(pair=pair, model=model, draft=draft, max_tokens=max_tokens, num_draft=num_draft,
                      p_min=p_min, on_cancel=on_cancel, system=system, drafting=drafting, max_kv_size=max_kv_size,
                      chat_template=chat_template)
        params = sampling_params(sampling, sampling_kw)
        if num_draft_max is not None or draft_vocab is not None or kv_bits is not None or kv_group_size != 64:
            from ..core.options import BadValue, check_all

            try:  # `kv_bits`, `kv_group_size`: api.make_decoder's
                check_all(**{k: v for k, v in (("num_draft_max", num_draft_max), ("draft_vocab", draft_vocab),
                                               ("kv_bits", kv_bits), ("kv_group_size", kv_group_size))
                             if v is not None})
            except BadValue as e:
                raise SessionSettingError(str(e)) from None
        if pair is None:
            from ..models.loading import load

            uses_draft_model = draft is not None or drafter in (None, "model", "hybrid") or isinstance(drafter, Drafter)
            pair = load(model, draft, no_draft=no_draft or not uses_draft_model)  # lookup etc.: no partner loaded
        self.pair = pair
        self.tokenizer = pair.tokenizer
        self.on_cancel = on_cancel
        self._max_tokens = max_tokens
        self.eos_token_ids = set(pair.eos_token_ids)
        self._params = params
        self._lock = threading.Lock()
        self._active: SessionStream | None = None
        self._turn_cancel: threading.Event | None = None  # the running turn's cancel flag (set under the lock)
        self.decoder = SpeculativeDecoder(pair.target, Drafter(), FixedK(0), pair.context_length, pair.vocab_size,
                                          tree=tree, max_kv_size=max_kv_size, kv_bits=kv_bits,
                                          kv_group_size=kv_group_size)
        self._drafting = Drafting(pair, self.decoder, drafter, num_draft, p_min, max_kv_size,
                                  num_draft_max=num_draft_max, draft_vocab=draft_vocab, cost_profile=cost_profile)
        self.max_kv_size = max_kv_size
        self.chat_template = chat_template
        if drafting is None:
            drafting = self._drafting.available
        if drafting:
            self._drafting.switch(True)
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
            self._params = sampling_params(self._params, kw)

    @property
    def temp(self) -> float:
        return self._params.temp

    @temp.setter
    def temp(self, value: float):
        self.set_sampling(temp=float(value))

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @max_tokens.setter
    def max_tokens(self, n: int):
        check_options(max_tokens=n)
        self._max_tokens = n

    @property
    def has_draft_model(self) -> bool:
        return self.pair.draft is not None

    @property
    def drafter(self) -> str:
        """The drafter used while drafting is on ('model', 'lookup', ...; 'none' if there is none)."""
        return self._drafting.name

    @property
    def drafting(self) -> bool:
        """Whether replies are drafted.  Setting it keeps the target's cache."""
        return self._drafting.on

    @drafting.setter
    def drafting(self, on: bool):
        with self._exclusive("switch drafting"):
            self._drafting.switch(bool(on))

    @property
    def draft(self) -> bool:
        """Deprecated: `drafting` (draft= names a draft model)."""
        return self.drafting

    @draft.setter
    def draft(self, on: bool):
        warnings.warn("Session.draft = on/off is now Session.drafting", DeprecationWarning, stacklevel=2)
        self.drafting = on

    @property
    def num_draft(self):
        return self._drafting.num_draft

    @num_draft.setter
    def num_draft(self, value):
        check_options(num_draft=value)
        with self._exclusive("change the draft length"):
            self._drafting.set_num_draft(value)

    @property
    def current_k(self) -> int:
        """Draft length the policy will use next (0 with drafting off)."""
        if not self._drafting.on:
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
        if text and not self.chat_template:
            raise SessionSettingError(NO_TEMPLATE_SYSTEM)
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
            self._drafting.reset()

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
        return session_prompt.render(self.tokenizer, messages)

    def build_prompt(self, user_text: str) -> tuple[str, list[int]]:
        """(prompt text, prompt tokens) for the next turn (session/prompt.py).  The tokens
        start with the conversation's exact token history when the new text extends it."""
        if not self.chat_template:
            return session_prompt.raw(self.tokenizer, user_text, self._tokens, self._token_text)
        messages = self.conversation() + [{"role": "user", "content": user_text}]
        return session_prompt.templated(self.tokenizer, messages, self._tokens, self._token_text)

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
            check_options(max_tokens=max_tokens)
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
        if stats.finish_reason in ("cancelled", "error") and (self.on_cancel == "drop" or not s.reply.tokens):
            # Dropped on request, or stopped while the message was still being processed
            # (no reply token yet): the conversation and token history stay as before the
            # turn, so the next turn does not process the message again; sync() trims the caches.
            return
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

    # -- persistence (the file format and its checks: session/file_format.py) -------
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
        are loaded.  `overrides` are Session keyword arguments (e.g. drafting=False).
        Every field is checked: a bad file is a one-line MlxspecError naming it."""
        return load_session(cls, path, pair, **overrides)
