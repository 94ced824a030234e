"""Which rank this is, how the target is split, and what each rank must hold.

`from_launch` reads what `mlx.launch` sets (MLX_RANK, and the backend's own variables:
a hostfile for ring, a coordinator for JACCL) and joins the group; outside it, None.
`Sharding.apply` splits a lazily loaded target with the class's own mlx-lm code before
any weight is read; `check_memory` budgets this rank's share (models/memory.py's rules).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

from ..errors import MlxspecError
from ..util.untrusted import printable

LAUNCH_VARS = ("MLX_RANK", "OMPI_COMM_WORLD_RANK")


def launched() -> bool:
    """Does this process run under mlx.launch (or mpirun)?"""
    return any(v in os.environ for v in LAUNCH_VARS)


def from_launch(pipeline: bool = False, drafter: str | None = None) -> "Sharding | None":
    """This process's Sharding under mlx.launch with two or more ranks; None otherwise
    (`--pipeline` outside mlx.launch is refused)."""
    if not launched():
        if pipeline:
            raise MlxspecError("--pipeline splits the target over the ranks of mlx.launch: run "
                               "`mlx.launch --hosts HOSTS -- mlxspec ... --pipeline` (docs/distributed.md)")
        return None
    import mlx.core as mx

    try:
        group = mx.distributed.init(strict=True)
    except (RuntimeError, ValueError) as e:
        raise MlxspecError(f"cannot join the ranks of mlx.launch: {printable(str(e).strip(), 300)}") from None
    if group.size() < 2:
        return None
    if drafter == "layerskip":
        refuse(group.rank(), "--drafter layerskip drafts with the target itself, which is split over the ranks "
                           "here: use a draft model (--draft) or --drafter lookup")
    return Sharding(group, pipeline)


REFUSAL_WAIT = 10  # seconds a rank other than 0 leaves rank 0 to say a refusal all ranks reach


def refuse(rank: int, message: str):
    """A refusal every rank reaches alike (the same command line and files): rank 0 says it in one
    line; the others wait for mlx.launch to stop them once rank 0 has exited with it, so the line is
    printed once, and say it themselves only if they were not stopped."""
    if rank:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: os._exit(1))  # stopped: rank 0 has said it
        time.sleep(REFUSAL_WAIT)
    raise MlxspecError(message)


def _class_name(model) -> str:
    return f"{type(model).__module__.rpartition('.')[2]}.{type(model).__name__}"


class Sharding:
    def __init__(self, group, pipeline: bool = False):
        from .channel import Channel
        from .mirror import Leader

        self.group, self.pipeline = group, pipeline
        self.rank, self.size = group.rank(), group.size()
        self.channel = Channel(group)
        self.leader = Leader(self.channel) if self.rank == 0 else None
        if self.leader is not None:
            atexit.register(self.leader.end)  # the other ranks stop with rank 0, whatever ends it
        else:
            _silence_stdout()  # only rank 0 talks to the user
            if threading.current_thread() is threading.main_thread():  # a terminal's Ctrl-C is rank 0's to take:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the others follow it, and end when it ends
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._stopped)

    def _stopped(self, signum, frame):
        """mlx.launch stops every rank with SIGTERM once one of them has failed: one line, and no
        collective after it (the failed rank would never answer)."""
        self.channel.broken = MlxspecError(f"rank {self.rank}: stopped because another rank of the run ended "
                                           "(mlx.launch's warning names it)")
        raise self.channel.broken

    @property
    def mode(self) -> str:
        return f"{'pipeline' if self.pipeline else 'tensor'} parallel over {self.size} ranks"

    def apply(self, model, config: dict) -> None:
        """Split `model` (loaded lazily: no weight read yet) for this rank with mlx-lm's own code."""
        from ..models.memory import text_config

        name = _class_name(model)
        if self.pipeline:
            if not (hasattr(model, "model") and hasattr(model.model, "pipeline")):
                refuse(self.rank, f"the target's model class {name} has no pipeline sharding in mlx-lm "
                                   "(`model.pipeline`): drop --pipeline for tensor parallel"
                                   + ("" if hasattr(model, "shard") else ", which it lacks too"))
            if len(model.model.layers) < self.size:
                refuse(self.rank, f"the target has {len(model.model.layers)} layers: too few for {self.size} "
                                   "pipeline ranks")
            model.model.pipeline(self.group)
        else:
            if not hasattr(model, "shard"):
                refuse(self.rank, f"the target's model class {name} has no tensor-parallel sharding in mlx-lm "
                                   "(`shard`)" + (": try --pipeline" if hasattr(getattr(model, "model", None),
                                                                               "pipeline") else ""))
            c = text_config(config)
            heads = [c.get("num_attention_heads"), c.get("num_key_value_heads", c.get("num_attention_heads"))]
            if any(isinstance(h, int) and h % self.size for h in heads):
                refuse(self.rank, f"the target's {heads[0]} attention heads ({heads[1]} key/value heads) do not "
                                   f"divide among {self.size} ranks: run {self._divisors(heads)} ranks, "
                                   "or --pipeline")
            model.shard(self.group)
        if self.leader is not None:
            from .mirror import state_class

            model.mlxspec_state = state_class(self.leader)  # core/cache.py: ModelState(model) is mirrored
        model.mlxspec_sharding = self.mode  # the calibration is kept apart from the whole model's

    @staticmethod
    def _divisors(heads) -> str:
        ok = [n for n in range(2, 9) if all(not isinstance(h, int) or h % n == 0 for h in heads)]
        return "/".join(map(str, ok)) if ok else "1"

    def check_memory(self, target_dir, draft_dir=None) -> None:
        """Refuse, before any weight is read, a share that cannot fit this rank's memory."""
        from .memory import check_rank_fits

        check_rank_fits(target_dir, draft_dir if self.rank == 0 else None, self.rank, self.size, self.pipeline)

    def follow(self, target_model) -> int:
        """Ranks >= 1: follow rank 0's target passes until it ends; 0, the exit status."""
        from .mirror import follow

        follow(self.channel, target_model)
        return 0


def _silence_stdout() -> None:
    """Ranks >= 1 print nothing on standard output (errors still reach stderr)."""
    from ..util import progress

    progress.set_enabled(False)
    try:
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
