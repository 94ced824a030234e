"""Every rank's copy of the target's state, kept in step by rank 0's messages.

Rank 0 runs the decoder as it is; its target states are `MirroredState`s (a sharded
target model names the class: `ModelState`'s constructor picks it, core/cache.py), so
every operation that feeds or rolls back the target's cache -- `sync(history)`,
`forward`, `prefill`, `reset`, a tree block's `forward` and `commit` (trees/attention.py)
-- first sends one small message saying what it does, then does it, and evaluates
the forward before the next message, so the sharded forward's collectives line up on
every rank.  The other ranks (`follow`) hold the same states on their shard and do
the same operations on them, the logits discarded: their caches follow the same
`sync(history)` rule.  A history travels as the length it shares with the previous
one and the rest (a round sends what it kept and the next token).

One lock makes each operation (message and forward) whole, so a server's threads may
each drive a state of their own.  States that rank 0 drops are dropped on the other
ranks with the next message.
"""

from __future__ import annotations

import signal
import threading
import weakref
from contextlib import contextmanager

import mlx.core as mx

from ..core.cache import ModelState, common_prefix
from ..trees.attention import TreeBlock
from .channel import Channel

CREATE, DROP, SYNC, FORWARD, PREFILL, RESET, TREE, COMMIT, END = range(1, 10)
NONE = -1  # a None integer in a message


def _opt(v):
    return NONE if v is None else int(v)


class Leader:
    """Rank 0's end: assigns state ids, remembers each state's last history sent."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self.lock = threading.RLock()
        self.next_id = 0
        self.dropped: list[int] = []  # ids whose states were dropped on rank 0 (sent with the next message)
        self.sent: dict[int, list[int]] = {}
        self.ended = False
        self.waiting: list[int] = []  # operations without a collective, sent with the next one that has

    def send(self, op: list[int], collective: bool = True) -> None:
        """Send `op` now, with every operation waiting (dropped states first); or, for an operation
        that runs no collective (sync, commit, create, reset), keep it for the next message: a
        round's sync or commit rides with its forward, one message a round."""
        while self.dropped:
            sid = self.dropped.pop()
            self.sent.pop(sid, None)
            self.waiting += [2, DROP, sid]
        self.waiting += [len(op), *op]
        if collective:
            message, self.waiting = self.waiting, []
            self.channel.send(message)

    def history(self, sid: int, history: list[int]) -> list[int]:
        """(kept, *rest): `history` as the length it shares with the last one sent for `sid`, and the rest."""
        last = self.sent.get(sid, [])
        keep = common_prefix(last, history)
        self.sent[sid] = list(history)
        return [keep, *history[keep:]]

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def drop(self, sid: int) -> None:  # a finalizer: any thread, any time; no collective here
        self.dropped.append(sid)

    def end(self) -> None:
        """Tell the other ranks to stop (once; a lost peer is not waited for)."""
        with self.lock:
            if self.ended or self.channel.broken is not None or not self.next_id:
                return  # (no state was ever made: the other ranks may never have got to follow)
            self.ended = True
            try:
                self.send([END])
            except Exception:
                pass


@contextmanager
def _interrupts_after():
    """Take a Ctrl-C (SIGINT) once the operation is whole, as its handler would have: a message
    sent and its forward left undone would leave the other ranks in a collective rank 0 never
    joins.  Yields the list a Ctrl-C is noted in (a prefill stops at its next chunk for it)."""
    pending: list = []
    if threading.current_thread() is not threading.main_thread():
        yield pending  # signals reach the main thread only
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield pending
    finally:
        signal.signal(signal.SIGINT, old)
        if pending and callable(old):
            old(signal.SIGINT, None)
        elif pending and old == signal.SIG_DFL:
            raise KeyboardInterrupt


class MirroredState(ModelState):
    """Rank 0's target state: each cache operation is sent to the other ranks first."""

    leader: Leader  # set on the subclass `state_class` makes

    def __init__(self, model, max_kv_size=None, kv_quant=None):
        self._quiet = True  # ModelState.__init__ resets: nothing to send yet
        super().__init__(model, max_kv_size, kv_quant)
        self.sid = self.leader.new_id()
        bits, group = kv_quant if kv_quant is not None else (None, None)
        with self._mirrored([CREATE, self.sid, _opt(max_kv_size), _opt(bits), _opt(group)], collective=False):
            pass
        weakref.finalize(self, self.leader.drop, self.sid)

    @contextmanager
    def _mirrored(self, message: list[int], collective: bool = True):
        leader = self.leader
        with leader.lock:
            if leader.ended:
                from ..errors import MlxspecError

                raise MlxspecError("the distributed run has ended: no more target passes")
            self._quiet = True
            try:
                with _interrupts_after() as pending:
                    leader.send(message, collective)
                    yield pending
            except RuntimeError as e:  # a sharded forward's own collective
                leader.channel.fail(e)
                raise
            finally:
                self._quiet = False

    def sync(self, history):
        if self._quiet:
            return super().sync(history)
        with self._mirrored([SYNC, self.sid, *self.leader.history(self.sid, history)], collective=False):
            return super().sync(history)

    def forward(self, tokens, width=None):
        if self._quiet or isinstance(tokens, mx.array):
            return super().forward(tokens, width)
        with self._mirrored([FORWARD, self.sid, self.merge_limit, _opt(width), *tokens]):
            logits = super().forward(tokens, width)
            mx.eval(logits)
        return logits

    def prefill(self, history, should_stop=None):
        if self._quiet:
            return super().prefill(history, should_stop)
        message = [PREFILL, self.sid, 1, *self.leader.history(self.sid, history)]
        with self._mirrored(message) as pending:  # a Ctrl-C (pending) stops it between chunks, on every rank
            return super().prefill(history, lambda: self.leader.channel.flag(
                bool(pending) or (should_stop is not None and should_stop())))

    def reset(self):
        if self._quiet:
            return super().reset()
        with self._mirrored([RESET, self.sid], collective=False):
            super().reset()


class MirroredBlock(TreeBlock):
    """Rank 0's tree block over a MirroredState: its forwards and commit are sent first."""

    def __init__(self, state):
        super().__init__(state)
        self.opened = False  # the other ranks open their block with this one's first forward

    def forward(self, tokens, parents, width=None):
        s = self.state
        message = [TREE, s.sid, int(not self.opened), _opt(width), len(tokens), *tokens, *parents]
        with s._mirrored(message):
            logits = super().forward(tokens, parents, width)
            mx.eval(logits)
        self.opened = True
        return logits

    def commit(self, path):
        with self.state._mirrored([COMMIT, self.state.sid, *path], collective=False):
            super().commit(path)


MirroredState.tree_block = MirroredBlock  # TreeBlock's constructor picks it for these states


def state_class(leader: Leader) -> type:
    """The MirroredState subclass a sharded target model names on rank 0."""
    return type("MirroredState", (MirroredState,), {"leader": leader})


def follow(channel: Channel, model) -> dict:
    """Ranks >= 1: do what rank 0's messages say with `model` (this rank's shard) until it
    sends END; the message counts."""
    states: dict[int, ModelState] = {}
    blocks: dict[int, TreeBlock] = {}
    histories: dict[int, list[int]] = {}

    while True:
        frame = channel.receive()
        while frame:
            m, frame = frame[1: 1 + frame[0]], frame[1 + frame[0]:]
            if m[0] == END:
                return channel.stats()
            _apply(m, states, blocks, histories, channel, model)


def _apply(m, states, blocks, histories, channel, model) -> None:
    """Do one of rank 0's operations on this rank's states."""

    def history(sid, keep, rest):
        h = histories.get(sid, [])[:keep] + rest
        histories[sid] = h
        return h

    op = m[0]
    sid = m[1]
    if op == CREATE:
        max_kv, bits, group = (None if v == NONE else v for v in m[2:5])
        states[sid] = ModelState(model, max_kv, None if bits is None else (bits, group))
        return
    if op == DROP:
        for d in (states, blocks, histories):
            d.pop(sid, None)
        return
    state = states[sid]
    if op == SYNC:
        state.sync(history(sid, m[2], m[3:]))
    elif op == FORWARD:
        state.merge_limit = m[2]
        mx.eval(state.forward(m[4:], None if m[3] == NONE else m[3]))
    elif op == PREFILL:
        stop = (lambda: channel.flag()) if m[2] else None
        state.prefill(history(sid, m[3], m[4:]), stop)
    elif op == RESET:
        state.reset()
    elif op == TREE:
        n = m[4]
        if m[2] or sid not in blocks:
            blocks[sid] = TreeBlock(state)
        mx.eval(blocks[sid].forward(m[5: 5 + n], m[5 + n: 5 + 2 * n], None if m[3] == NONE else m[3]))
    elif op == COMMIT:
        blocks[sid].commit(m[2:])
    else:
        raise ValueError(f"unknown message {op} from rank 0")
