"""Rank 0's small messages to the other ranks, and what a lost peer looks like.

A message is a list of ints that rank 0 broadcasts: `mx.distributed.all_sum` where the
other ranks add zeros.  The first collective is always `SIZE` ints (the length, then as
much of the message as fits); a longer message (a long prompt's tokens) follows in a
second collective of exactly the rest.  Every rank takes part in every collective in
the same order, so the messages line up with the sharded forwards' own collectives.
The counters say how many collectives and bytes the messages cost (`stats`).
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import MlxspecError

SIZE = 64  # ints in a message's first collective (256 bytes)
BACKEND_MARKS = ("[ring]", "[jaccl]", "[mpi]", "[nccl]", "[distributed]")


def peers(rank: int, size: int) -> str:
    """The ranks `rank` exchanges data with on a ring."""
    near = sorted({(rank - 1) % size, (rank + 1) % size} - {rank})
    return "rank " + " or ".join(str(r) for r in near)


def lost(e: BaseException, rank: int, size: int) -> MlxspecError | None:
    """The one-line error for a collective that failed because a peer went away, else None."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if not isinstance(e, RuntimeError) or not text.startswith(BACKEND_MARKS):
        return None
    return MlxspecError(f"rank {rank}: lost the connection to {peers(rank, size)} ({text}); "
                        "the distributed run stops on every rank")


class Channel:
    def __init__(self, group):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.messages = 0  # collectives spent on messages
        self.bytes = 0  # their payload (each rank's contribution)
        self.broken: MlxspecError | None = None  # set once a peer is lost

    def _all_sum(self, values: list[int], n: int) -> list[int]:
        if self.broken is not None:  # a collective after a lost peer would wait forever
            raise self.broken
        x = mx.array(values, dtype=mx.int32) if values else mx.zeros((n,), dtype=mx.int32)
        try:
            out = mx.distributed.all_sum(x, group=self.group, stream=mx.cpu)
            mx.eval(out)
        except RuntimeError as e:
            self.fail(e)
            raise
        self.messages += 1
        self.bytes += 4 * n
        return out.tolist()

    def fail(self, e: BaseException) -> None:
        """Note a failed collective; raise the one-line error when a peer was lost (no collective runs after)."""
        error = lost(e, self.rank, self.size)
        if error is not None:
            self.broken = error
            raise error from None

    def send(self, message: list[int]) -> None:
        """Rank 0: broadcast `message` (ints fitting int32)."""
        n = len(message)
        head = [n] + list(message[: SIZE - 1])
        self._all_sum(head + [0] * (SIZE - len(head)), SIZE)
        if n > SIZE - 1:
            self._all_sum(list(message[SIZE - 1:]), n - SIZE + 1)

    def receive(self) -> list[int]:
        """Ranks >= 1: the next message rank 0 sends."""
        head = self._all_sum([], SIZE)
        n = head[0]
        message = head[1: 1 + min(n, SIZE - 1)]
        if n > SIZE - 1:
            message += self._all_sum([], n - SIZE + 1)
        return message

    def flag(self, value: bool | None = None) -> bool:
        """A one-int message: rank 0 gives `value`, the others get it."""
        if self.rank == 0:
            self.send([int(bool(value))])
            return bool(value)
        return bool(self.receive()[0])

    def stats(self) -> dict:
        return {"messages": self.messages, "bytes": self.bytes}
