"""One turn of a Session: the stream of Chunks `Session.stream()` returns, and its Reply.

The stream holds the session's lock from the moment the turn starts until it is
exhausted, closed or garbage-collected; `_finish` hands the outcome to
`Session._commit_turn`, which decides what stays in the conversation.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..api import Chunk, GenerationStream
from ..core.stats import GenerationStats


@dataclass
class Reply:
    text: str
    tokens: list
    stats: GenerationStats
    finish_reason: str | None  # "stop" (EOS), "length" (max tokens), "context", "cancelled", "error"

    @property
    def cancelled(self) -> bool:
        return self.finish_reason == "cancelled"


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
