"""Folders mlxspec or MLX load code from are this user's alone (util/private_dirs.py): the
mlxspec home is made 0700, a folder someone else could write is refused with one line,
and MLX's CPU kernel cache ($TMPDIR/mlx) never lands in a shared temp folder such as
/tmp, where another user could have made `mlx` first and planted libraries in it."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.util import private_dirs

ROOT = Path(__file__).resolve().parents[1]
COMPILE = ("import mlxspec, os, mlx.core as mx\n"
           "f = mx.compile(lambda x: mx.exp(x) * 5 + 2)\n"
           "mx.eval(f(mx.array([1.0, 2.0])))\n"
           "print(os.environ.get('TMPDIR'))\n")


def _shared_tmp(tmp_path: Path) -> Path:
    """A folder like /tmp (1777) with an `mlx` tree in it that anyone may write, as another
    user would leave it after making it first."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    cpu = shared / "mlx" / "planted" / "cpu"
    cpu.mkdir(parents=True)
    for p in (cpu, cpu.parent, cpu.parent.parent):
        os.chmod(p, 0o777)
        if os.getuid() == 0:
            os.chown(p, 65534, 65534)
    return shared


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=ROOT,
                          timeout=300)


def _libraries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("lib*.so")) if folder.exists() else []


def test_mlx_kernels_are_compiled_into_a_private_folder_not_a_shared_tmp(tmp_path):
    shared, home = _shared_tmp(tmp_path), tmp_path / "home"
    r = _python(COMPILE, TMPDIR=str(shared), MLXSPEC_HOME=str(home))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == str(home / "tmp") and r.stderr == ""
    assert _libraries(shared) == []  # nothing compiled into, or loaded from, the shared tree
    assert _libraries(home / "tmp" / "mlx")
    for folder in (home, home / "tmp"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()


def test_a_private_tmpdir_is_kept(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    r = _python(COMPILE, TMPDIR=str(mine), MLXSPEC_HOME=str(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == str(mine) and _libraries(mine / "mlx")
    assert not (tmp_path / "home" / "tmp").exists()


def test_mlx_imported_before_mlxspec_one_line_and_later_kernels_go_private(tmp_path):
    shared, home = _shared_tmp(tmp_path), tmp_path / "home"
    r = _python("import mlx.core\n" + COMPILE, TMPDIR=str(shared), MLXSPEC_HOME=str(home))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlxspec: mlx.core was imported before mlxspec"), r.stderr
    assert _libraries(shared) == [] and _libraries(home / "tmp" / "mlx")


def test_an_unsafe_home_falls_back_to_a_fresh_private_temp_with_one_line(tmp_path):
    shared, home = _shared_tmp(tmp_path), tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    r = _python(COMPILE, TMPDIR=str(shared), MLXSPEC_HOME=str(home))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "writable by group or others" in lines[0], r.stderr
    used = Path(r.stdout.split()[-1])
    assert used.parent == shared and used.name.startswith("mlxspec-")
    assert not used.exists()  # removed when the process ended
    assert _libraries(shared) == [] and not (home / "tmp").exists()


def test_the_home_and_its_folders_are_created_0700(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "a" / "b" / "home"))
    kernels = private_dirs.private("kernels")
    for p in (kernels, kernels.parent, kernels.parent.parent, kernels.parent.parent.parent):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700
    assert private_dirs.problem(kernels) is None


@pytest.mark.parametrize("mode", [0o770, 0o757])
def test_a_folder_others_can_write_is_refused(tmp_path, mode):
    folder = tmp_path / "kernels"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(private_dirs.UnsafeFolder, match="writable by group or others") as e:
        private_dirs.ensure(folder)
    assert "\n" not in str(e.value)
    below = folder / "below"  # a private folder under a folder others may write: renamed away at will
    below.mkdir(mode=0o700)
    assert "writable by group or others" in private_dirs.problem(below)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(private_dirs.UnsafeFolder, match="belongs to uid 65534"):
        private_dirs.ensure(folder)


def test_a_symlinked_home_is_judged_by_its_target(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    assert private_dirs.problem(tmp_path / "link") is None
    os.chmod(real, 0o777)
    assert "writable by group or others" in private_dirs.problem(tmp_path / "link")
