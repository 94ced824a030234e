"""The cached small-batch kernel (small_gemm.build) is loaded only when it is this user's
own and unchanged since it was built; anything else is built again. A compiler that
fails or hangs costs its time once, not on every later run, and a Ctrl-C held while the
command starts (startup_signals) ends a long compile at once, with exit 130."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxspec.cpu import kernel as small_gemm

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(small_gemm._compiler() is None, reason="no C compiler")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty mlxspec home for in-process builds; the loaded kernel's state is left as it was."""
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(small_gemm._state, "why", None)
    return tmp_path / "home"


def _script(folder: Path, body: str) -> str:
    cc = folder / "cc"
    cc.write_text("#!/bin/sh\n" + body + "\n")
    cc.chmod(0o755)
    return str(cc)


def test_a_cached_build_that_does_not_check_out_is_built_again(home):
    out = small_gemm.build()
    assert out is not None and out.exists(), small_gemm.why()
    good = out.read_bytes()
    out.write_bytes(b"\x7fELF not the library that was built")  # corrupt, or swapped: same owner, same name
    assert small_gemm.build() == out and out.read_bytes() == good
    out.chmod(0o777)  # anyone could have written it
    assert small_gemm.build() == out and out.stat().st_mode & 0o022 == 0
    Path(str(out) + ".sha256").unlink()  # no record of what was built
    assert small_gemm.build() == out and small_gemm.verified(out)
    if os.getuid() == 0:
        os.chown(out, 65534, 65534)  # another user's file
        assert small_gemm.build() == out and out.stat().st_uid == 0


def test_a_kernels_folder_others_can_write_is_not_used(home, capsys):
    kernels = home / "kernels"
    kernels.mkdir(parents=True)
    kernels.chmod(0o777)
    assert small_gemm.build() is None
    assert "kernels folder is not private" in small_gemm.why()
    assert list(kernels.iterdir()) == []


def test_a_failed_or_hung_compiler_is_not_retried_on_every_run(home, tmp_path, monkeypatch):
    monkeypatch.setattr(small_gemm, "BUILD_TIMEOUT_S", 1)
    monkeypatch.setenv("CC", _script(tmp_path, "exec sleep 30"))
    t = time.monotonic()
    assert small_gemm.build() is None and "ran over 1 s" in small_gemm.why()
    assert time.monotonic() - t < 10
    t = time.monotonic()
    assert small_gemm.build() is None and time.monotonic() - t < 0.5
    assert "not retried until the source or compiler changes" in small_gemm.why()
    assert not any(p.name.endswith(".tmp") for p in (home / "kernels").iterdir())

    monkeypatch.setenv("CC", _script(tmp_path, "echo 'error: broken compiler' >&2; exit 1"))  # another compiler
    assert small_gemm.build() is None and "error: broken compiler" in small_gemm.why()
    old = time.time() - small_gemm.RETRY_AFTER_S - 60
    for marker in (home / "kernels").glob("*.failed"):
        os.utime(marker, (old, old))  # a day later: tried again
    assert small_gemm.build() is None and "not retried" not in small_gemm.why()


def test_ctrl_c_while_the_kernel_compiles_ends_the_command_at_once(tmp_path):
    started = tmp_path / "started"
    cc = _script(tmp_path, f"touch {started}\nexec sleep 60")
    env = {**os.environ, "MLXSPEC_HOME": str(tmp_path / "home"), "CC": cc}
    proc = subprocess.Popen([sys.executable, "-m", "mlxspec.cli", "--help"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), "the compiler never started"
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, err
        assert time.monotonic() - t < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kernels = tmp_path / "home" / "kernels"
    assert sorted(p.name for p in kernels.iterdir()) == []  # no temp left, and no failure recorded
