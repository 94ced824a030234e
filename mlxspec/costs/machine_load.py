"""Was the machine busy with other programs while this process measured something?

A calibration (costs/cost_model.py) times the draft and the target against each other on
the CPU this process shares with everything else, and is cached for every later
run.  Measured here with the test suite running beside it, calibrations priced the
default draft's step at 0.76, 0.55 and 1.07 plain steps -- 0.26 on the same machine
idle -- because a draft step (many short operations handed between threads) suffers
more from a competing program than a target pass (bound by memory) does; the first
also priced a pass over 4 positions as one over 1, and a round then made 2.78 tokens
instead of ~5.  Nothing in the timings themselves gives that away: in the second,
the largest and smallest timing of each width were no more than 1.2x apart.  The
CPU time other programs used does: a cached calibration taken while they kept the
machine busy would mis-size every later round (drafts priced too dear: rounds too
short, or plain decoding).

`Watch` reads the machine's busy time (Linux: /proc/stat, steal included: a host
running other guests is busy too) and this process's own CPU time (every thread)
around a measurement; `others` is the average number of cores the rest of the
machine kept busy meanwhile.  Where the machine's busy time cannot be read (macOS,
other systems) it is None and nothing changes.  MLXSPEC_BUSY_CORES sets the limit
(BUSY_CORES by default; the test suite sets it to inf except where it tests it).
"""

from __future__ import annotations

import os
import time

BUSY_CORES = 0.5  # other programs' average use (cores) above which a calibration is not cached
ENV = "MLXSPEC_BUSY_CORES"  # overrides BUSY_CORES ("inf": cache whatever the load)
STAT = "/proc/stat"
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal ("cpu" line; guest is in user)


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine has been busy since boot, or None where unknown."""
    try:
        with open(STAT) as f:
            head = f.readline().split()
        ticks = [int(x) for x in head[1:]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not head or head[0] != "cpu" or len(ticks) < 8 or hz <= 0:
        return None
    return sum(ticks[i] for i in _BUSY_FIELDS) / hz


def own_seconds() -> float:
    """CPU seconds this process (all its threads, not its children) has used."""
    t = os.times()
    return t.user + t.system


class Watch:
    """`with Watch() as w: ...`; then `w.others`: the cores other programs kept busy on
    average meanwhile (None where the machine's busy time is unknown)."""

    def __init__(self):
        self.others: float | None = None

    def __enter__(self) -> "Watch":
        self._start = (machine_busy_seconds(), own_seconds(), time.monotonic())
        return self

    def __exit__(self, *exc) -> None:
        busy0, own0, t0 = self._start
        busy1, wall = machine_busy_seconds(), time.monotonic() - t0
        if busy0 is None or busy1 is None or wall <= 0:
            return
        self.others = max(0.0, (busy1 - busy0) - (own_seconds() - own0)) / wall

    def busy(self) -> bool:
        return too_busy(self.others)

    def describe(self) -> str:
        return describe(self.others)


def limit() -> float:
    """BUSY_CORES, or the number in MLXSPEC_BUSY_CORES."""
    text = os.environ.get(ENV)
    if text is None:
        return BUSY_CORES
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        from ..errors import MlxspecError

        raise MlxspecError(f"{ENV}={text!r}: give a number of cores (0 or more, or inf), e.g. {ENV}=0.5")
    return value


def idle_now(seconds: float = 1.0) -> bool:
    """Are other programs keeping at most the limit of cores busy right now (a short look)?
    True where the machine's busy time is unknown."""
    with Watch() as w:
        time.sleep(seconds)
    return not w.busy()


def too_busy(others: float | None) -> bool:
    """Did other programs keep more cores busy than the limit (None: unknown, so no)?"""
    return others is not None and others > limit()


def describe(others: float) -> str:
    return f"other programs kept {others:.1f} cores busy on average"
