"""A Ctrl-C while the `mlxspec` command starts is never lost.

MLX's CPU backend asks once per process, at the first call of a compiled function,
whether it can compile kernels: it runs `g++ --version` through the C library's
system(), and system() ignores SIGINT in the calling process until the command ends.
A Ctrl-C in that window was discarded, and the run went on as if nothing had been
pressed. A test that interrupted `generate` while its libraries loaded got the whole
generation and exit status 0, once in about 11 runs beside busy test processes.

So the command (not a program that imports mlxspec: its signals are its own) holds
SIGINT blocked from the moment the package is imported, before any library starts a
thread. Every thread started after that (OpenBLAS's, MLX's, the kernels' pool)
inherits the block, so SIGINT can only go to the main thread. The block ends once
`release` has made that check run. Linux never discards a blocked signal, even one
whose action is "ignore", so a SIGINT that comes meanwhile stays pending and arrives
when the main thread unblocks it. One that is already pending when system() sets
"ignore" would be dropped, so `release` lets a pending one through first.

Anything long that runs while SIGINT is held must look for it itself: the build of
the small-batch kernel (cpu/kernel.py, at import) polls `signal.sigpending()` and
kills the compiler on a held Ctrl-C, which then arrives here (exit 130).
"""

from __future__ import annotations

import os
import signal
import sys

HELD = {signal.SIGINT} if hasattr(signal, "pthread_sigmask") else set()
_state = {"held": False}


def running_as_command() -> bool:
    """Is this process the `mlxspec` command: the console script, or `python -m mlxspec.cli`
    (cli.py installs its start-up handler and releases the block; nothing else would)?"""
    if os.path.basename(sys.argv[0] if sys.argv else "") == "mlxspec":
        return True
    orig = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "mlxspec.cli" for a, b in zip(orig, orig[1:]))


def hold() -> None:
    """Block SIGINT in this thread (and so in every thread it starts), if this is the
    command and SIGINT is not ignored (a background job's stays ignored)."""
    if HELD and not _state["held"] and running_as_command() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        _state["held"] = True


def _one(x):
    return x + 1


def release() -> None:
    """Run MLX's compiler check now, then unblock SIGINT: a SIGINT held meanwhile goes to
    the handler in place (the command's: exit 130 while it starts)."""
    if not _state["held"]:
        return
    import mlx.core as mx

    probe, x = mx.compile(_one), mx.array(0)
    if HELD & signal.sigpending():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)  # delivered here, before system() could drop it
    mx.eval(probe(x))  # the first compiled call: MLX's `g++ --version`, SIGINT ignored meanwhile
    _state["held"] = False
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
