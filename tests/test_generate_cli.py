"""`mlxspec generate` as a user runs it (issue 13, items 2, 3 and 7): Ctrl-C at any moment
keeps what was generated, says "interrupted" and exits 130 with no traceback; the summary
line gives the finish reason, the context limit included; --compare measures like bench."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tiny_models

CONTEXT = 4096
LONG = 30_000
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sends signals"),
              pytest.mark.linux_cpu]


@pytest.fixture(scope="module")
def chatty(tmp_path_factory):
    """A tiny pair that never emits EOS: a generation runs to max tokens or the context."""
    return tiny_models.save_chatty_pair(tmp_path_factory.mktemp("chatty"), CONTEXT)


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    """The same with a long context: asked for LONG tokens, a generation runs for a minute or
    more at the ~500 tok/s of a fast machine, so a Ctrl-C cannot come after it has ended."""
    return tiny_models.save_chatty_pair(tmp_path_factory.mktemp("endless"), LONG + 64)


@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    """The same, with a 48-token context."""
    return tiny_models.save_chatty_pair(tmp_path_factory.mktemp("short"), 48)


def cli(*args, timeout=300):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "mlxspec.cli", "generate", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


class Child:
    """`mlxspec generate ...` in a child process whose output is read as it comes."""

    def __init__(self, *args, env=None):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}  # SIGABRT: stacks
        self.p = subprocess.Popen([sys.executable, "-m", "mlxspec.cli", "generate", *map(str, args)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.out, self.err = b"", b""
        for f in (self.p.stdout, self.p.stderr):
            os.set_blocking(f.fileno(), False)

    def _read(self):
        for name, f in (("out", self.p.stdout), ("err", self.p.stderr)):
            try:
                data = f.read()
            except BlockingIOError:
                data = None
            if data:
                setattr(self, name, getattr(self, name) + data)

    def wait_for(self, ready, timeout=240.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._read()
            if ready(self):
                return
            if self.p.poll() is not None:
                self._read()
                pytest.fail(f"generate ended (rc {self.p.returncode}) too early:\n{self.err.decode()[-3000:]}")
            time.sleep(0.002)
        self.p.kill()
        pytest.fail(f"timed out; stderr:\n{self.err.decode()[-3000:]}")

    def interrupt(self, timeout=120):
        self.p.send_signal(signal.SIGINT)
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = self.p.poll()  # not None: it ended, and something it started holds its pipes open
            self.p.send_signal(signal.SIGABRT)  # faulthandler prints where each thread is stuck
            try:
                _, err = self.p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                err = b""
            pytest.fail(f"no end of output {timeout} s after SIGINT (exit status then: {rc}); stderr:\n"
                        f"{(self.err + (err or b'')).decode(errors='replace')[-6000:]}")
        self.out += out or b""
        self.err += err or b""
        return self.p.returncode, self.out.decode(), self.err.decode()


def mapped(pattern):
    """Ready once the child has mapped a shared library whose path contains `pattern`."""
    def ready(c):
        try:
            return pattern in Path(f"/proc/{c.p.pid}/maps").read_text()
        except OSError:
            return False
    return ready


def assert_interrupted(rc, err):
    assert rc == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted" in err, err


def test_ctrl_c_while_the_libraries_load(chatty):
    t, d = chatty
    c = Child("--model", t, "--draft", d, "-p", "hello", "-m", 3000)
    c.wait_for(mapped("libmlx"))  # MLX itself is being imported
    rc, out, err = c.interrupt()
    assert_interrupted(rc, err)


@pytest.mark.skipif(shutil.which("g++") is None, reason="MLX's compiler check runs g++")
def test_ctrl_c_while_mlx_checks_for_its_compiler(chatty, tmp_path):
    """MLX runs `g++ --version` once, through system(), which ignores SIGINT meanwhile: a
    Ctrl-C then was lost and the generation ran to its end.  Here that g++ takes seconds."""
    t, d = chatty
    mark = tmp_path / "checking"
    shim = tmp_path / "bin" / "g++"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then : > "{mark}"; sleep 4; fi\n'
                    f'exec {shutil.which("g++")} "$@"\n')
    shim.chmod(0o755)
    c = Child("--model", t, "--draft", d, "-p", "hello", "-m", 3000,
              env={"PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    c.wait_for(lambda c: mark.exists())
    rc, out, err = c.interrupt()
    assert_interrupted(rc, err)
    assert not out.strip()  # it ended there, not after a generation


def generating(c, since: list, min_bytes=20, min_s=1.0):
    """Ready once the header is out and then either `min_bytes` of text came or `min_s` passed:
    the streaming detokenizer holds back text that ends inside a UTF-8 character, and a random
    model may emit such bytes for a long while, so the text alone is no sign of progress."""
    if b"drafted by" not in c.err:
        return False
    since[:] = since or [time.monotonic()]
    return len(c.out) > min_bytes or time.monotonic() - since[0] > min_s


def test_ctrl_c_during_generation_keeps_the_partial_output(endless):
    t, d = endless
    c = Child("--model", t, "--draft", d, "-p", "hello", "-m", LONG, "--num-draft", 3)
    since = []
    c.wait_for(lambda c: generating(c, since))
    seen = c.out
    rc, out, err = c.interrupt()
    assert_interrupted(rc, err)
    assert c.out.startswith(seen) and len(c.out) > len(seen)  # what was generated stays, and the line is ended
    summary = [ln for ln in err.splitlines() if ln.startswith("[") and "tok/s" in ln][-1]
    n = int(summary[1:].split(" tokens")[0])
    assert 0 < n < LONG and "finish: interrupted" in summary, summary


def test_ctrl_c_in_json_mode_prints_the_partial_json(endless):
    t, d = endless
    c = Child("--model", t, "--draft", d, "-p", "hello", "-m", LONG, "--num-draft", 3, "--json")
    since = []
    c.wait_for(lambda c: generating(c, since, min_bytes=1 << 30))  # (no text on stdout in JSON mode)
    rc, out, err = c.interrupt()
    assert rc == 130 and "Traceback" not in err, err
    doc = json.loads(out)
    assert doc["interrupted"] is True and doc["finish_reason"] == "cancelled"
    assert 0 < doc["stats"]["generated_tokens"] == len(doc["tokens"]) < LONG


def test_ctrl_c_during_compare(chatty):
    t, d = chatty
    c = Child("--model", t, "--draft", d, "-p", "hello", "-m", 400, "--num-draft", 3, "--compare",
              "--compare-repeats", 5)
    c.wait_for(lambda c: b"finish: length" in c.err)  # the speculative run is done; --compare starts
    rc, out, err = c.interrupt()
    assert_interrupted(rc, err)
    assert len(c.out) > 100  # the first run's text stays


@pytest.mark.real
def test_ctrl_c_during_a_long_prefill():
    from mlxspec.models.pinned import fetch as weights

    if not weights.is_present("smollm2-135m"):
        pytest.skip("SmolLM2-135M is not in the cache (mlxspec pull smollm2)")
    prompt = " ".join(f"word{i % 97} and" for i in range(1500))  # ~4,500 tokens: seconds of prefill here
    c = Child("--model", "smollm2-135m", "--no-draft", "-p", prompt, "--ignore-chat-template", "-m", 20)
    c.wait_for(lambda c: b"no draft model" in c.err)  # the header: the prompt goes in now
    time.sleep(0.5)
    rc, out, err = c.interrupt()
    assert_interrupted(rc, err)
    assert not out.strip()  # interrupted before the first token
    assert "[0 tokens" in err and "finish: interrupted" in err, err


def test_summary_gives_the_finish_reason(chatty, short_context):
    t, d = chatty
    r = cli("--model", t, "--draft", d, "-p", "hello", "-m", 7)
    assert r.returncode == 0, r.stderr
    assert "finish: length (max tokens reached)" in r.stderr
    t, d = short_context
    r = cli("--model", t, "--draft", d, "-p", "hello there", "--ignore-chat-template", "-m", 100)
    assert r.returncode == 0, r.stderr
    assert "finish: context (the model's context is full)" in r.stderr
    assert "stopped at the model's context limit (48 tokens)" in r.stderr
    r = cli("--model", t, "--draft", d, "-p", "hello there", "--ignore-chat-template", "-m", 100, "--json")
    doc = json.loads(r.stdout)
    assert doc["finish_reason"] == "context" and doc["interrupted"] is False
    assert 0 < len(doc["tokens"]) < 48


def test_compare_warms_up_repeats_and_gives_the_spread(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    r = cli("--model", t, "--draft", d, "-p", "hello", "-m", 12, "--num-draft", 3, "--compare",
            "--compare-repeats", 3)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("[compare ") == 3
    line = [ln for ln in r.stderr.splitlines() if "interleaved runs" in ln][-1]
    assert "median of 3 interleaved runs after a warm-up; range " in line and "identical output: True" in line
    r = cli("--model", t, "--draft", d, "-p", "hello", "-m", 12, "--num-draft", 3, "--compare",
            "--compare-repeats", 2, "--json")
    doc = json.loads(r.stdout)
    c = doc["compare"]
    assert c["repeats"] == len(c["runs"]) == 2 and c["same_tokens"] is True
    assert c["min"] <= c["speedup"] <= c["max"] and isinstance(c["within_noise"], bool)
    assert doc["speedup"] == c["speedup"] and doc["plain"]["same_text"] is True


def test_noise_verdict():
    from mlxspec.bench.compare import spread_verdict

    assert spread_verdict([1.5, 1.6, 1.4]) == {"speedup": 1.5, "min": 1.4, "max": 1.6, "repeats": 3,
                                                "within_noise": False}
    assert spread_verdict([0.9, 1.2, 1.05])["within_noise"]  # the runs disagree which side is faster
    assert spread_verdict([1.02, 1.3, 1.04])["within_noise"]  # closer to 1x than the spread
    assert spread_verdict([2.0])["within_noise"]  # one run: no spread to judge by
