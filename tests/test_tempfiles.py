"""mlxspec.util.tempfiles: temps named after their process; only those of dead processes are removed."""

import os
import signal
import subprocess
import sys
import time

import pytest

from mlxspec.util import tempfiles
from mlxspec.models.pinned import fetch as weights


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid is free (a zombie would still count as alive)
    return p.pid


@pytest.fixture
def live_pid():
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def make(folder, name, is_dir=False):
    path = folder / name
    if is_dir:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x" * 1000)
    else:
        path.write_bytes(b"x" * 1000)
    return path


def test_names_carry_the_pid(tmp_path):
    fd, f = tempfiles.mkstemp(tmp_path, "smollm2-135m.gguf")
    os.close(fd)
    d = tempfiles.mkdtemp(tmp_path, "b179c9523d0e6a0f")
    n = tempfiles.temp_name(tmp_path, "pair")
    for p, stem in ((f, "smollm2-135m.gguf"), (d, "b179c9523d0e6a0f"), (n, "pair")):
        assert p.name.startswith(f".{stem}.{os.getpid()}.") and p.name.endswith(".tmp")
        assert tempfiles.owner(p.name) == os.getpid()
        assert tempfiles.TEMP.match(p.name).group("stem") == stem
    assert not n.exists()
    assert tempfiles.owner("smollm2-135m.gguf") is None and tempfiles.owner(".x.gguf.k3j4h5g6.tmp") is None


def test_only_temps_of_dead_processes_are_removed(tmp_path, live_pid):
    dead = dead_pid()
    keep = [
        make(tmp_path, f".smollm2-135m.gguf.{live_pid}.abc123.tmp"),  # another pull, still running
        make(tmp_path, f".b179c9523d0e6a0f.{live_pid}.x_9.tmp", is_dir=True),
        make(tmp_path, f".b179c9523d0e6a0f.{os.getpid()}.mine.tmp", is_dir=True),  # this process's own
        make(tmp_path, "smollm2-135m.gguf"),
        make(tmp_path, "smollm2-135m.gguf.verified"),
        make(tmp_path, ".hidden-but-not-a-temp"),
        make(tmp_path, ".smollm2-135m.gguf.k3j4h5g6.tmp"),  # old-style name, fresh: may be in use
    ]
    gone = [
        make(tmp_path, f".smollm2-135m.gguf.{dead}.abc123.tmp"),
        make(tmp_path, f".b179c9523d0e6a0f.{dead}.q1w2e3.tmp", is_dir=True),
        make(tmp_path, ".b179c9523d0e6a0f-q1w2e3r4.tmp", is_dir=True),  # old-style name, untouched for 2 days
    ]
    old = time.time() - 2 * 86400
    os.utime(gone[-1], (old, old))
    removed = tempfiles.remove_stale(tmp_path)
    assert sorted(removed) == sorted(p.name for p in gone)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in gone)
    assert tempfiles.remove_stale(tmp_path) == []


def test_stem_limits_the_sweep_to_one_name(tmp_path):
    dead = dead_pid()
    mine = make(tmp_path, f".pair.{dead}.abc.tmp", is_dir=True)
    other = make(tmp_path, f".other.{dead}.abc.tmp", is_dir=True)
    legacy = make(tmp_path, ".notes.tmp")
    os.utime(legacy, (0, 0))
    assert tempfiles.remove_stale(tmp_path, stem="pair") == [mine.name]
    assert other.exists() and legacy.exists()


def test_pull_removes_stale_temps_in_the_wheels_and_gguf_folders(tmp_path, monkeypatch, live_pid):
    """A real (fake-model) ensure: the killed runs' temps go, a live run's stay."""
    import test_weights as tw

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    spec = tw.fake_spec()
    monkeypatch.setitem(weights.CATALOG, spec.name, spec)
    tw.put_wheels(spec)
    gguf_dir = weights.gguf_path(spec.name).parent
    gguf_dir.mkdir(parents=True)
    dead = dead_pid()
    gone = [make(gguf_dir, f".fake-model.gguf.{dead}.a1.tmp"), make(weights.wheels_dir(), f".pip.{dead}.b2.tmp", True)]
    keep = [make(gguf_dir, f".fake-model.gguf.{live_pid}.a1.tmp"),
            make(weights.wheels_dir(), f".pip.{live_pid}.b2.tmp", True)]
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip should not run"))
    assert weights.ensure(spec.name, progress=False).read_bytes() == tw.WHOLE
    assert not any(p.exists() for p in gone) and all(p.exists() for p in keep)


def test_signals_raise_only_replaces_default_handlers_and_restores_them():
    def own(signum, frame):
        pass

    old_hup = signal.signal(signal.SIGHUP, own)
    try:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        with tempfiles.signals_raise():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            assert signal.getsignal(signal.SIGHUP) is own  # an application's handler is left alone
            with pytest.raises(SystemExit) as e:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            assert e.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is own
    finally:
        signal.signal(signal.SIGHUP, old_hup)


@pytest.mark.real
def test_a_running_conversion_keeps_its_temp_when_another_process_sweeps(tmp_path):
    """A real conversion runs while a second process does the sweep every writer does first."""
    gguf = weights.ensure("smollm2-135m")  # the shared cache
    home = tmp_path / "home"
    env = {**os.environ, "MLXSPEC_HOME": str(home), "TRANSFORMERS_VERBOSITY": "error"}
    code = f"from mlxspec.models.gguf.convert import convert; convert({str(gguf)!r}, progress=False)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not list((home / "models").glob(".*")) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.005)
        (temp,) = (home / "models").glob(".*")
        assert tempfiles.owner(temp.name) == proc.pid
        code = f"from mlxspec.util import tempfiles; print(tempfiles.remove_stale({str(temp.parent)!r}))"
        sweep = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=60)
        assert sweep.returncode == 0 and sweep.stdout.strip() == "[]", sweep.stderr
        assert temp.is_dir()
    finally:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert [p.name for p in (home / "models").iterdir()] == [weights.CATALOG["smollm2-135m"].sha256]
