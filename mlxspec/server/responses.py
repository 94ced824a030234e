"""`mlxspec serve`: stop strings, and the OpenAI shapes of what the server sends.

Stop strings work on text: `StopMatcher` holds back any tail of the reply that
could still become a stop string, and ends the reply at the first one (the stop
string itself is not sent, as OpenAI does).  Each text piece keeps whether it
came from an accepted draft token, so the chat page can colour it.
"""

from __future__ import annotations

import json
import time
import uuid


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending: list[list] = []  # [text, from_draft] pieces not yet released
        self.stopped = False

    def feed(self, text: str, from_draft: bool) -> list[tuple[str, bool]]:
        """The pieces that are safe to send now."""
        if self.stopped or not text:
            return []
        if not self.stops:
            return [(text, from_draft)]
        self.pending.append([text, from_draft])
        buf = "".join(t for t, _ in self.pending)
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out = self._take(min(hits))
            self.pending = []
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        return self._take(len(buf) - hold)

    def flush(self) -> list[tuple[str, bool]]:
        """At the end of the reply: whatever was held back (it never became a stop string)."""
        out = [] if self.stopped else [(t, d) for t, d in self.pending if t]
        self.pending = []
        return out

    def _take(self, n: int) -> list[tuple[str, bool]]:
        out = []
        while n > 0 and self.pending:
            text, draft = self.pending[0]
            if len(text) <= n:
                out.append((text, draft))
                self.pending.pop(0)
                n -= len(text)
            else:
                out.append((text[:n], draft))
                self.pending[0][0] = text[n:]
                n = 0
        return out


def speculative_stats(stats, num_draft) -> dict:
    """The `speculative` object of every response (field names documented in the README)."""
    reused = max(0, stats.prompt_tokens - stats.prompt_tokens_processed)
    return {
        "drafter": stats.drafter,
        "num_draft_tokens": num_draft,
        "drafted": stats.draft_proposed,
        "accepted": stats.draft_accepted,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "target_passes": stats.target_passes,
        "tokens_per_pass": round(stats.tokens_per_pass, 4),
        "tokens_speculative": stats.tokens_speculative,
        "tokens_plain": stats.tokens_plain,
        "fallback": any(n.startswith("fallback") for n in stats.notes),
        "prompt_tokens": stats.prompt_tokens,
        "prompt_tokens_processed": stats.prompt_tokens_processed,
        "prompt_tokens_reused": reused,
        "generated_tokens": stats.generated_tokens,
        "generation_tps": round(stats.generation_tps, 2),
    }


def usage(stats) -> dict:
    reused = max(0, stats.prompt_tokens - stats.prompt_tokens_processed)
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": reused}}


def openai_finish(reason: str | None) -> str:
    """Our finish reasons (stop, length, context, cancelled) as OpenAI's (stop, length)."""
    return "stop" if reason == "stop" else "length"


class Shapes:
    """Builds the JSON objects of one response (one id, one creation time)."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish: str, stats, num_draft) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
            obj = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = self._head("text_completion")
        return {**obj, "choices": [choice], "usage": usage(stats), "speculative": speculative_stats(stats, num_draft)}

    def chunk(self, text: str | None, finish: str | None = None, from_draft: bool | None = None,
              role: bool = False) -> dict:
        """One streamed piece.  `from_draft` (an extra field the chat page reads)
        says the piece came from accepted draft tokens."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = self._head("text_completion")
        if from_draft is not None:
            choice["from_draft"] = from_draft
        return {**obj, "choices": [choice]}

    def usage_chunk(self, stats, num_draft) -> dict:
        """The last chunk when `stream_options.include_usage` is set: no choices, usage and stats."""
        obj = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        return {**obj, "choices": [], "usage": usage(stats), "speculative": speculative_stats(stats, num_draft)}


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
