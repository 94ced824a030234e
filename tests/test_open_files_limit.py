"""mlx-lm sets the open-files limit to (2048, 4096) when it is imported; under a hard limit
below 4096 that raised ValueError and every command that loads a model crashed
(util/open_files_limit.py). Now the soft limit is raised only as far as the hard one allows,
and neither is ever lowered."""

import ctypes
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PR_CAPBSET_DROP, CAP_SYS_RESOURCE = 24, 24
PROBE = ("import mlxspec, resource, mlx_lm.models.cache\n"
         "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n")


def _limited(soft: int, hard: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if os.geteuid() == 0:  # root may raise a hard limit: not once it drops CAP_SYS_RESOURCE
            if ctypes.CDLL(None, use_errno=True).prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl")
    return preexec


def _run(args, soft, hard, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          preexec_fn=_limited(soft, hard), **kw)


def _hard_now():
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


@pytest.mark.skipif(_hard_now() != resource.RLIM_INFINITY and _hard_now() < 1024, reason="hard limit below 1024")
def test_mlx_lm_imports_under_a_hard_limit_below_4096():
    r = _run(["-c", PROBE], 512, 1024)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1024", "1024"]  # raised as far as allowed


@pytest.mark.skipif(_hard_now() != resource.RLIM_INFINITY and _hard_now() < 8192, reason="hard limit below 8192")
def test_neither_limit_is_lowered():
    r = _run(["-c", PROBE], 1024, 8192)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["2048", "8192"]  # the soft one raised to mlx-lm's 2048; the hard one kept
    r = _run(["-c", PROBE], 3000, 8192)
    assert r.stdout.split() == ["3000", "8192"], r.stderr[-2000:]


@pytest.mark.skipif(_hard_now() != resource.RLIM_INFINITY and _hard_now() < 1024, reason="hard limit below 1024")
def test_generate_runs_under_a_hard_limit_below_4096(tiny_pair_dirs, tmp_path):
    target, _ = tiny_pair_dirs
    env = {**os.environ, "MLXSPEC_HOME": str(tmp_path / "home")}
    r = _run(["-m", "mlxspec.cli", "generate", "--model", str(target), "--no-draft", "-p", "hi", "-m", "3"],
             512, 1024, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "3 tokens" in r.stderr or "3 tokens" in r.stdout, r.stdout + r.stderr
