"""Folders only this user can write: the mlxspec home, its kernels folder, and the temp
folder MLX compiles its CPU kernels into.

Whatever mlxspec (or MLX) later loads as code must come from a folder no other local
user could have written into. A folder is *private* when it is a folder owned by this
user and not writable by group or others, and no folder above it lets anyone else
rename it away (each one is not group/other-writable, or is sticky like /tmp); a
symbolic link is judged by the folder it leads to. `ensure` creates the missing parts
0700 and checks the result, at creation and at every use; on failure it raises
`UnsafeFolder` with one line.

MLX's CPU backend compiles the kernels of `mx.compile`d functions with the system
compiler into `<temp>/mlx/<version>/cpu/lib*.so` and loads any library it finds there,
where `<temp>` is C++'s `std::filesystem::temp_directory_path()`: `$TMPDIR`, else
/tmp, looked up at every compile (not once). Under a shared /tmp another user could
create /tmp/mlx first and plant libraries that would run as this user. So on import,
`secure_mlx_temp()` keeps a `$TMPDIR` that is private with a private `mlx` tree in it,
and otherwise sets `TMPDIR` for this process (and the processes it starts) to
`<mlxspec home>/tmp`, a private folder; where that fails too, to a new folder made
by `tempfile.mkdtemp` (private by construction), removed when the process exits.
So Python's `tempfile` defaults (where not yet looked up) and child processes' temps
go there as well. When a program imported mlx.core before mlxspec and compiled from an
unsafe tree, one line on stderr says so.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from ..errors import MlxspecError

_state: dict = {"warned": set()}


class UnsafeFolder(MlxspecError):
    """A folder mlxspec would load code from is writable by someone else."""


def problem(path: Path, uid: int | None = None) -> str | None:
    """Why `path` is not a private folder of user `uid` (this user), or None if it is.
    A symbolic link is followed: the folder it leads to is checked, and the folders above
    both the link and its target."""
    uid = os.getuid() if uid is None else uid
    path = Path(path).absolute()
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}, not to this user ({uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    for parent in dict.fromkeys([*real.parents, *path.parents]):
        try:
            pst = os.stat(parent)
        except OSError as e:
            return f"{parent} cannot be read ({e.strerror or e})"
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            return f"{parent} is writable by group or others (mode {stat.S_IMODE(pst.st_mode):o})"
    return None


def file_problem(path: Path, uid: int | None = None, folder: bool = False) -> str | None:
    """Why `path` (a regular file, or with `folder` a folder; never a symbolic link) could have
    been written by someone else, or None. The folders above it are not checked."""
    uid = os.getuid() if uid is None else uid
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e})"
    if not (stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)):
        return f"{path} is not a {'folder' if folder else 'regular file'}"
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}, not to this user ({uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def ensure(path: Path) -> Path:
    """`path` as a private folder: the missing parts created 0700, then checked.
    Raises `UnsafeFolder` (one line) if it is not private."""
    path = Path(path).expanduser().absolute()
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass  # another process made it meanwhile: checked below like any other
        except OSError as e:
            raise UnsafeFolder(f"cannot create {p} ({e.strerror or e})") from None
    why = problem(path)
    if why is not None:
        raise UnsafeFolder(f"{why}: mlxspec keeps code there, so it must be this user's alone")
    return path


def home() -> Path:
    """The mlxspec home (paths.cache_dir()), private."""
    from .paths import cache_dir

    return ensure(cache_dir())


def private(name: str) -> Path:
    """`<mlxspec home>/<name>`, private (the home too)."""
    return ensure(home() / name)


def warn(line: str, key: str | None = None) -> None:
    """One line on stderr, once per process for each `key` (default: the line)."""
    key = line if key is None else key
    if key not in _state["warned"]:
        _state["warned"].add(key)
        sys.stderr.write(f"mlxspec: {line}\n")


def temp_root() -> Path:
    """What C++'s temp_directory_path() answers now: $TMPDIR (if a folder), else /tmp."""
    env = os.environ.get("TMPDIR")
    return Path(env) if env and os.path.isdir(env) else Path("/tmp")


def tree_problem(root: Path) -> str | None:
    """Why `root` (a temp folder) or anything in the `mlx` tree in it could be another
    user's, or None."""
    why = problem(root)
    if why is not None:
        return why
    mlx = root / "mlx"
    if not os.path.lexists(mlx):
        return None
    stack = [mlx]
    while stack:
        folder = stack.pop()
        why = file_problem(folder, folder=True)
        if why is not None:
            return why
        try:
            entries = list(os.scandir(folder))
        except OSError as e:
            return f"{folder} cannot be read ({e.strerror or e})"
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            else:
                why = file_problem(Path(entry.path))
                if why is not None:
                    return why
    return None


def secure_mlx_temp() -> Path:
    """Point MLX's CPU kernel cache (`$TMPDIR/mlx`) at a private folder; the folder used.
    Idempotent; never raises (the last resort is a new mkdtemp folder)."""
    if "path" in _state:
        return _state["path"]
    current = temp_root()
    why = tree_problem(current)
    if why is None:
        _state["path"] = current
        return current
    if "mlx.core" in sys.modules and os.path.lexists(current / "mlx"):
        warn(f"mlx.core was imported before mlxspec and its kernel cache may not be this user's alone "
             f"({why}); MLX's kernels compiled from now on go to a private folder")
    try:
        target = private("tmp")
        why = tree_problem(target)
        if why is not None:
            raise UnsafeFolder(why)
    except (UnsafeFolder, OSError) as e:
        import atexit
        import shutil
        import tempfile

        for parent in dict.fromkeys([tempfile.gettempdir(), "/tmp"]):  # made 0700 at once, by this user
            target = Path(tempfile.mkdtemp(prefix=f"mlxspec-{os.getuid()}-", dir=parent))
            atexit.register(shutil.rmtree, target, ignore_errors=True)
            if problem(target) is None:
                break
        warn(f"{e}; MLX compiles its kernels into {target} for this run", key=str(e))
    os.environ["TMPDIR"] = str(target)
    _state["path"] = target
    return target
