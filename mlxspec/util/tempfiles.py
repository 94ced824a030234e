"""Temp files and folders named after the process that writes them, and their cleanup.

mlxspec writes everything (a pulled GGUF, a converted model, downloaded wheels, a
`mlxspec convert` pair folder) into a hidden temp beside its final place and
renames it into place when complete.  A temp is named

    .<stem>.<pid>.<random>.tmp

so a temp left by a run that was killed (kill -9, a crash, power loss) can be told
from one still being written: every run that writes into a folder first calls
`remove_stale(folder)`, which deletes the temps whose process is gone and never
those of a live process (another pull or convert running at the same time).
Within a run, `signals_raise()` turns SIGTERM and SIGHUP into `SystemExit`, so the
`finally` blocks that delete a run's own temps run on those signals too.

Temps from before names carried a pid (`.<name>.<random>.tmp`) cannot be traced to
a process; `remove_stale` deletes them once they have not changed for a day.
A cache shared by several machines (a network home folder) should not be written
by two of them at once: a pid is only meaningful on the machine that made it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

TEMP = re.compile(r"^\.(?P<stem>.+)\.(?P<pid>\d+)\.[a-z0-9_]+\.tmp$")
LEGACY = re.compile(r"^\..+\.tmp$")  # mlxspec 0.1.0's cache temps: no pid in the name
LEGACY_AGE_S = 24 * 3600
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _prefix(stem: str) -> str:
    return f".{stem}.{os.getpid()}."


def mkstemp(folder: Path, stem: str) -> tuple[int, Path]:
    """(fd, path) of a new temp file in `folder` (mode 0600), owned by this process."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=_prefix(stem), suffix=".tmp")
    return fd, Path(name)


def mkdtemp(folder: Path, stem: str) -> Path:
    """A new empty temp folder in `folder` (mode 0700), owned by this process."""
    return Path(tempfile.mkdtemp(dir=folder, prefix=_prefix(stem), suffix=".tmp"))


def temp_name(folder: Path, stem: str) -> Path:
    """An unused temp path in `folder` owned by this process (not created: a rename target)."""
    return Path(folder) / f"{_prefix(stem)}{secrets.token_hex(6)}.tmp"


def owner(name: str) -> int | None:
    """The pid in a temp's name, or None if `name` is not a temp name with a pid."""
    m = TEMP.match(name)
    return int(m.group("pid")) if m else None


def is_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (a zombie, not yet waited for, counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, belongs to another user
        return True
    except (OverflowError, OSError):
        return False
    return True


def is_stale(path: Path, now: float | None = None) -> bool:
    """A temp whose process is gone (or, for an old-style name, untouched for a day)."""
    pid = owner(path.name)
    if pid is not None:
        return not is_alive(pid)
    if LEGACY.match(path.name):
        try:
            return (now or time.time()) - path.lstat().st_mtime > LEGACY_AGE_S
        except OSError:
            return False
    return False


def remove(path: Path) -> None:
    """Delete a temp file or folder; one already gone (another run's cleanup) is fine."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def remove_stale(folder: Path, stem: str | None = None, legacy: bool = True) -> list[str]:
    """Delete the temps in `folder` left by processes that are gone; return their names.

    `stem` limits it to the temps of one name (for folders mlxspec does not own,
    such as the one `mlxspec convert -o` writes into); `legacy=False` leaves
    old-style names alone.
    """
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    removed = []
    for p in entries:
        m = TEMP.match(p.name)
        if stem is not None and (m is None or m.group("stem") != stem):
            continue
        if m is None and not legacy:
            continue
        if is_stale(p):
            remove(p)
            removed.append(p.name)
    return removed


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


@contextmanager
def signals_raise():
    """While in the block, SIGTERM and SIGHUP raise `SystemExit(128 + signal)`.

    So `finally` blocks (which delete this run's temps) run before the process
    ends.  Only in the main thread, and only for signals still at their default
    action: an application's own handlers are left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for s in SIGNALS:
        if signal.getsignal(s) is signal.SIG_DFL:
            saved[s] = signal.signal(s, _raise_exit)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
