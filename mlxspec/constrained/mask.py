"""Which tokens keep a reply valid JSON: a trie of the vocabulary's bytes walked with
the recogniser (json_machine.py), one additive mask (0 allowed, -inf not) per row.

`JsonConstraint` is what a SamplingParams carries as its `constraint`:
core/sampling.process_logits calls `mask(generated, V)` with each row's generated
tokens, for the target's rows and the draft's alike.  Costs stay low: a row's state
comes from its prefix's (cached per token prefix), a state's allowed tokens are
worked out once (cached per state), and inside a string, where almost every token
is allowed, the tokens that cannot leave it (no quote, backslash or control byte)
are one precomputed set, so only the few that can are walked.  The tries are built
once per tokenizer.  End-of-reply tokens are allowed exactly where the JSON is
complete; other special tokens never.
"""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np

from .json_machine import Machine
from .vocab import vocab_bytes

_LEAVES_STRING = frozenset(b'"\\') | frozenset(range(0x20))


class Trie:
    """Token bytes as nested dicts: node = [children {byte: node}, token ids ending here]."""

    def __init__(self, items):
        self.root = [{}, []]
        for tid, data in items:
            node = self.root
            for c in data:
                node = node[0].setdefault(c, [{}, []])
            node[1].append(tid)


class Vocabulary:
    """A tokenizer's tries: every token, and those that could end a string; the ones that cannot."""

    def __init__(self, table: list):
        self.size = len(table)
        ok = [(i, b) for i, b in enumerate(table) if b]
        self.all = Trie(ok)
        self.special = Trie([(i, b) for i, b in ok if _LEAVES_STRING & set(b)])
        self.plain = np.array([i for i, b in ok if not (_LEAVES_STRING & set(b))], dtype=np.int64)


_VOCABS: dict = {}
_LOCK = threading.Lock()


def vocabulary(tokenizer) -> Vocabulary:
    with _LOCK:
        hit = _VOCABS.get(id(tokenizer))
        if hit is None or hit[0] is not tokenizer:
            hit = _VOCABS[id(tokenizer)] = (tokenizer, Vocabulary(vocab_bytes(tokenizer)))
        return hit[1]


class JsonConstraint:
    """A reply that must be JSON (schema None: any object) -- see the module docstring.
    `bind` it to the tokenizer before generating."""

    def __init__(self, schema: dict | None = None, prefix: bytes = b"", suffix: bytes = b""):
        self.machine = Machine(schema, prefix, suffix)  # a SchemaError for a schema outside the subset
        self.vocab = None
        self.eos = ()
        self.states: dict = {(): self.machine.start()}  # generated tokens -> state (None: broken)
        self.allowed: dict = {}  # state -> (takes the plain string tokens, np ids)

    def bind(self, tokenizer, eos_token_ids) -> "JsonConstraint":
        self.vocab = vocabulary(tokenizer)
        self.table = vocab_bytes(tokenizer)
        self.eos = tuple(sorted(set(eos_token_ids)))
        return self

    def state(self, generated) -> tuple | None:
        key = tuple(generated)
        if key in self.states:
            return self.states[key]
        n = len(key) - 1
        while n > 0 and key[:n] not in self.states:
            n -= 1
        st = self.states[key[:n]]
        for i in range(n, len(key)):
            tok = key[i]
            data = self.table[tok] if st is not None and 0 <= tok < len(self.table) else None
            if data is None:
                st = None
            else:
                for c in data:
                    st = self.machine.step(st, c)
                    if st is None:
                        break
            self.states[key[: i + 1]] = st
        if len(self.states) > 4096:  # a long reply: keep the recent prefixes
            longest = max(len(k) for k in self.states)
            self.states = {k: v for k, v in self.states.items() if len(k) >= longest - 64 or not k}
        return st

    def _allowed(self, st):
        hit = self.allowed.get(st)
        if hit is not None:
            return hit
        plain = st[0] == "str" and st[1] == 0  # inside a string: plain tokens keep it there, unchanged
        ids: list = []
        self._walk(self.vocab.special.root if plain else self.vocab.all.root, st, ids)
        if self.machine.can_end(st):
            ids.extend(self.eos)
        hit = self.allowed[st] = (plain, np.array(ids, dtype=np.int64))
        return hit

    def _walk(self, node, st, out):
        out.extend(node[1])
        step = self.machine.step
        for c, child in node[0].items():
            nxt = step(st, c)
            if nxt is not None:
                self._walk(child, nxt, out)

    def mask(self, generated: list, width: int) -> mx.array:
        """(N, width) additive mask for rows whose generated tokens are `generated`."""
        rows = np.full((len(generated), width), -np.inf, dtype=np.float32)
        for r, g in enumerate(generated):
            st = self.state(g)
            if st is None:  # after a token the constraint refused (an unverified lookup draft): never emitted
                rows[r] = 0.0
                continue
            plain, ids = self._allowed(st)
            if plain:
                rows[r, self.vocab.plain[self.vocab.plain < width]] = 0.0
            rows[r, ids[ids < width]] = 0.0
        return mx.array(rows)
