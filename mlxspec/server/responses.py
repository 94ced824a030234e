"""`mlxspec serve`: stop strings, and the OpenAI shapes of what the server sends.

Stop strings work on text: `StopMatcher` holds back any tail of the reply that
could still become a stop string, and ends the reply at the first one (the stop
string itself is not sent, as OpenAI does).  Each text piece keeps whether it
came from an accepted draft token, so the chat page can colour it, and, when the
request asked for logprobs, its tokens' log-probabilities (OpenAI's shapes:
chat's `logprobs.content[{token, logprob, bytes, top_logprobs}]`, completions'
`logprobs.{tokens, token_logprobs, top_logprobs, text_offset}`).
"""

from __future__ import annotations

import json
import time
import uuid

from .tools import ToolStream, split_tool_calls


class StopMatcher:
    """`track=True`: `feed` also takes the token's chunk (api.Chunk, with logprobs) and pieces come
    out as (text, from_draft, [(token, logprob, top), ...]): each token's entry rides with the
    first piece released after it (a token whose text is still empty waits for the next); the
    tokens of a stop string are dropped with it."""

    def __init__(self, stops: list[str], track: bool = False):
        self.stops = [s for s in stops if s]
        self.track = track
        self.pending: list[list] = []  # [text, from_draft, entries] pieces not yet released
        self.stopped = False

    def feed(self, text: str, from_draft: bool, chunk=None) -> list[tuple]:
        """The pieces that are safe to send now."""
        entries = []
        if self.track and chunk is not None and getattr(chunk, "logprobs", None) is not None:
            entries = [(chunk.token, *chunk.logprobs)]
        if self.stopped or (not text and not entries):
            return []
        if not self.stops and not (self.track and not text):
            return [self._out(text, from_draft, self._waiting() + entries)]
        self.pending.append([text, from_draft, entries])
        if not self.stops:
            return []
        buf = "".join(t for t, _, _ in self.pending)
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

    def _waiting(self) -> list:
        """Entries of tokens with no text yet, when there are no stop strings."""
        out = [e for _, _, es in self.pending for e in es]
        self.pending = []
        return out

    def _out(self, text, draft, entries) -> tuple:
        return (text, draft, entries) if self.track else (text, draft)

    def flush(self) -> list[tuple]:
        """At the end of the reply: whatever was held back (it never became a stop string)."""
        out = [] if self.stopped else [self._out(t, d, e) for t, d, e in self.pending if t or e]
        self.pending = []
        return out

    def _take(self, n: int) -> list[tuple]:
        out = []
        while n > 0 and self.pending:
            text, draft, entries = self.pending[0]
            if len(text) <= n:
                out.append(self._out(text, draft, entries))
                self.pending.pop(0)
                n -= len(text)
            else:
                out.append(self._out(text[:n], draft, entries))
                self.pending[0][0] = text[n:]
                self.pending[0][2] = []
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
    """Builds the JSON objects of one response (one id, one creation time).  With the request
    (`req`) and the tokenizer it also gives each token's logprobs in OpenAI's shapes and turns
    tool calls in the reply into `tool_calls` (server/tools.py): feed the engine's "text" events
    to `add` (whole replies) or `stream_text` (chunks), then call `full` or `stream_end`."""

    def __init__(self, kind: str, model: str, req=None, tokenizer=None):
        self.kind, self.model = kind, model
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.req, self.tokenizer = req, tokenizer
        self.pieces: list[str] = []
        self.entries: list = []  # (token, logprob, top) of every token sent
        self.offset = 0  # completions: characters sent so far (text_offset)
        self.tool_fmt = getattr(req, "tool_format", None)
        self.tools = ToolStream(self.tool_fmt, req.tools) if self.tool_fmt is not None else None
        self.calls: list = []

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def add(self, ev) -> None:
        """One ("text", piece, from_draft[, entries]) event of a whole (not streamed) reply."""
        self.pieces.append(ev[1])
        if len(ev) > 3:
            self.entries.extend(ev[3])

    def _one_call(self, calls: list) -> list:
        return calls[:1] if getattr(self.req, "parallel_tool_calls", True) is False else calls

    def _finish(self, finish: str) -> str:
        return "tool_calls" if self.calls and finish == "stop" else finish

    def full(self, text: str | None, finish: str, stats, num_draft) -> dict:
        text = "".join(self.pieces) if text is None else text
        if self.kind == "chat":
            message = {"role": "assistant", "content": text}
            if self.tool_fmt is not None:
                content, calls = split_tool_calls(text, self.tool_fmt, self.req.tools)
                self.calls = self._one_call(calls)
                if self.calls:
                    message = {"role": "assistant", "content": content.strip() or None, "tool_calls": self.calls}
            choice = {"index": 0, "message": message, "logprobs": self._logprobs(self.entries),
                      "finish_reason": self._finish(finish)}
            obj = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": self._logprobs(self.entries), "finish_reason": finish}
            obj = self._head("text_completion")
        return {**obj, "choices": [choice], "usage": usage(stats), "speculative": speculative_stats(stats, num_draft)}

    def chunk(self, text: str | None, finish: str | None = None, from_draft: bool | None = None,
              role: bool = False, entries=None, tool_calls=None) -> dict:
        """One streamed piece.  `from_draft` (an extra field the chat page reads)
        says the piece came from accepted draft tokens."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            if tool_calls:
                delta["tool_calls"] = tool_calls
            lp = None if entries is None else self._logprobs(entries)  # role and finish chunks: null, as OpenAI
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
            obj = self._head("chat.completion.chunk")
        else:
            lp = None if entries is None else self._logprobs(entries)
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
            obj = self._head("text_completion")
        if from_draft is not None:
            choice["from_draft"] = from_draft
        return {**obj, "choices": [choice]}

    def stream_text(self, ev) -> list[dict]:
        """The chunks to send now for a ("text", piece, from_draft[, entries]) event."""
        text, draft, entries = ev[1], ev[2], (ev[3] if len(ev) > 3 else None)
        if self.tools is not None:
            text = self.tools.feed(text)
            if not text and not entries:
                return []
        return [self.chunk(text, from_draft=draft, entries=entries)]

    def stream_end(self, finish: str) -> list[dict]:
        """The last chunks: content a possible tool call held back, the tool calls, the finish reason."""
        out = []
        if self.tools is not None:
            rest, calls = self.tools.finish()
            self.calls = self._one_call(calls)
            if rest.strip() or (rest and not self.calls):
                out.append(self.chunk(rest))
            if self.calls:
                out.append(self.chunk(None, tool_calls=[{"index": i, **c} for i, c in enumerate(self.calls)]))
        out.append(self.chunk(None, finish=self._finish(finish)))
        return out

    def usage_chunk(self, stats, num_draft) -> dict:
        """The last chunk when `stream_options.include_usage` is set: no choices, usage and stats."""
        obj = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        return {**obj, "choices": [], "usage": usage(stats), "speculative": speculative_stats(stats, num_draft)}

    def _logprobs(self, entries):
        """OpenAI's logprobs object for these tokens' entries, or None when not asked for."""
        if getattr(self.req, "logprobs", None) is None:
            return None
        entries = entries or []
        if self.kind == "chat":
            return {"content": [{**self._token(t), "logprob": lp,
                                 "top_logprobs": [{**self._token(a), "logprob": v} for a, v in top]}
                                for t, lp, top in entries], "refusal": None}
        tokens = [self._token(t)["token"] for t, _, _ in entries]
        offsets = []
        for tok in tokens:
            offsets.append(self.offset)
            self.offset += len(tok)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [{self._token(a)["token"]: v for a, v in top} for _, _, top in entries],
                "text_offset": offsets}

    def _token(self, token: int) -> dict:
        raw = token_bytes_of(self.tokenizer, token)
        return {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw)}


def token_bytes_of(tokenizer, token: int) -> bytes:
    """A token's bytes (its text as the tokenizer writes it for special tokens)."""
    from ..constrained.vocab import vocab_bytes

    table = vocab_bytes(tokenizer)
    raw = table[token] if 0 <= token < len(table) else None
    if raw is None:
        try:
            raw = str(tokenizer.convert_ids_to_tokens(token)).encode("utf-8")
        except Exception:
            raw = b""
    return raw


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
