"""`mlxspec chat` driven through a real pseudo-terminal on a tiny model: turns,
slash commands, Ctrl-C mid-reply and at the prompt, Ctrl-D to leave."""

import json
import shutil
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import mlxspec  # noqa: F401  (before mlx.core)
import mlx.core as mx
import tiny_models

pytestmark = pytest.mark.skipif(not sys.platform.startswith(("linux", "darwin")), reason="needs a POSIX pty")

CONTEXT = 4096
EOS = 2


@pytest.fixture(scope="module")
def chatty_pair_dirs(tmp_path_factory):
    """The tiny pair with EOS made unreachable under greedy decoding (its
    lm_head row is zero: a logit of 0 never beats the best of ~300 random
    logits), so a reply runs until max tokens or the context: long enough to
    interrupt, short when --max-tokens says so."""
    root = tmp_path_factory.mktemp("chatty")
    cfg = tiny_models.config_for("qwen2", max_pos=CONTEXT)
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=1)
    for m in (target, draft):
        w = np.array(m.lm_head.weight)
        w[EOS] = 0.0
        m.lm_head.weight = mx.array(w)
    t = tiny_models.save_model_dir(root / "target", "qwen2", model=target, max_pos=CONTEXT)
    d = tiny_models.save_model_dir(root / "draft", "qwen2", model=draft, max_pos=CONTEXT)
    return t, d


class Pty:
    """A child process on a pseudo-terminal, with expect-style reads."""

    def __init__(self, argv, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.buf = b""
        self.pos = 0  # everything before pos has been matched already

    def read_some(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            data = b""
        if not data:
            raise EOFError
        self.buf += data
        return True

    def expect(self, pattern, timeout=60.0) -> re.Match:
        rx = re.compile(pattern.encode() if isinstance(pattern, str) else pattern, re.S)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.buf, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}; output so far:\n{self.tail()}")
            try:
                self.read_some(min(left, 1.0))
            except EOFError:
                raise AssertionError(f"child exited while waiting for {pattern!r}; output:\n{self.tail()}")

    def tail(self, n=3000):
        return self.buf[-n:].decode("utf-8", "replace")

    def send(self, data: str):
        os.write(self.fd, data.encode())

    def wait(self, timeout=30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.read_some(0.1)
            except EOFError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"chat did not exit; output:\n{self.tail()}")

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


PROMPT = r">>> "
SUMMARY = r"\[(\d+) tokens, [\d.]+ tok/s[^\]\n]*\]"


def test_chat_in_a_pty(chatty_pair_dirs, tmp_path):
    t, d = chatty_pair_dirs
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "dumb", "MLXSPEC_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "mlxspec.cli", "chat", "--model", str(t), "--draft", str(d),
            "--max-tokens", "12", "--num-draft", "3", "--show-draft", "--system", "be brief"]
    p = Pty(argv, env)
    try:
        p.expect(r"drafted by draft")
        p.expect(PROMPT)

        # two turns; the second processes only the new message
        p.send("hello there\n")
        m = p.expect(SUMMARY)
        assert m.group(1) == b"12" and b"acceptance" in m.group(0) and b"k=3" in m.group(0)
        assert b"\x1b[32m" in p.buf  # --show-draft: draft tokens in green
        p.expect(PROMPT)
        p.send("and again\n")
        m = p.expect(SUMMARY)
        processed, total = map(int, re.search(rb"prompt (\d+)/(\d+) tok", m.group(0)).groups())
        assert processed < total // 2
        p.expect(PROMPT)

        # slash commands
        p.send("/stats\n")
        p.expect(r"turns: 2 \(0 interrupted\)")
        p.expect(PROMPT)
        p.send("/draft off\n")
        p.expect(r"\[drafting off\]")
        p.expect(PROMPT)
        p.send("/max-tokens 100000\n")
        p.expect(r"\[max tokens 100000\]")
        p.expect(PROMPT)

        # Ctrl-C as soon as the long reply starts: it stops, the chat goes on
        p.send("/draft on\n")
        p.expect(PROMPT)
        p.send("tell me everything\n")
        p.expect(r"tell me everything\r?\n")  # the terminal's echo
        p.expect(rb"[^\r\n]")  # the first output of the reply
        p.send("\x03")
        m = p.expect(SUMMARY)
        assert b"interrupted" in m.group(0)
        assert int(m.group(1)) < CONTEXT // 2  # stopped long before the context was full
        p.expect(PROMPT)

        # another turn still works on the same conversation
        p.send("/max-tokens 5\n")
        p.expect(PROMPT)
        p.send("are you still there\n")
        m = p.expect(SUMMARY)
        assert m.group(1) == b"5" and b"interrupted" not in m.group(0)
        p.expect(PROMPT)
        p.send("/stats\n")
        p.expect(r"turns: 4 \(1 interrupted\)")
        p.expect(PROMPT)

        # Ctrl-C at the prompt does not quit; Ctrl-D does, with status 0.  The Ctrl-C
        # waits until the line is echoed and a moment more: a SIGINT that lands while
        # input() is still setting up readline (before its select()) is only seen
        # at the next keystroke -- CPython's readline, not the chat.
        p.send("half a line")
        p.expect(r"half a line")
        time.sleep(0.3)
        p.send("\x03")
        p.expect(r"use /quit or Ctrl-D")
        p.expect(PROMPT)
        p.send("\x04")
        assert p.wait() == 0
    finally:
        p.kill()


def test_chat_piped_with_a_pair_folder(chatty_pair_dirs, tmp_path):
    """Not a terminal: lines from a pipe, --pair DIR, end of input = exit 0."""
    t, d = chatty_pair_dirs
    pair = tmp_path / "pair"
    pair.mkdir()
    shutil.copytree(t, pair / "target")  # a pair folder holds its models (paths outside it are refused)
    shutil.copytree(d, pair / "draft")
    (pair / "pair.json").write_text(json.dumps({"target": {"path": "target"}, "draft": {"path": "draft"}}))
    save = tmp_path / "conv.json"
    r = subprocess.run([sys.executable, "-m", "mlxspec.cli", "chat", "--pair", str(pair), "--max-tokens", "4"],
                       input=f"hi\n/nope\n/save {save}\n", capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, r.stderr
    assert re.search(SUMMARY, r.stdout) and "unknown command /nope" in r.stdout
    assert "\x1b[" not in r.stdout  # no colours when not asked and not a terminal
    data = json.loads(save.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]


def test_chat_template_error_refuses_the_turn_and_the_chat_goes_on(chatty_pair_dirs, tmp_path):
    """A template that raises (raise_exception for a system message, a Jinja sandbox
    SecurityError) refuses that turn with a one-line message; the conversation
    stays, the next turn works and /save writes it."""
    strict = tiny_models.copy_with_chat_template(chatty_pair_dirs[0], tmp_path / "strict", tiny_models.STRICT_CHATML)
    save = tmp_path / "conv.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "dumb", "MLXSPEC_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "mlxspec.cli", "chat", "--model", str(strict), "--no-draft", "--max-tokens", "4"]
    p = Pty(argv, env)
    try:
        p.expect(PROMPT)
        p.send("hello\n")
        p.expect(SUMMARY)
        p.expect(PROMPT)
        p.send("/system talk like a pirate\n")
        p.expect(r"\[system prompt set\]")
        p.expect(PROMPT)
        p.send("ahoy\n")
        p.expect(r"\[error: the chat template cannot render this conversation: System role not supported; "
                 r"the message was not sent\]\r?\n")
        p.expect(PROMPT)
        p.send("/system -\n")
        p.expect(r"\[system prompt cleared\]")
        p.expect(PROMPT)
        p.send("peek\n")
        p.expect(r"\[error: the chat template cannot render this conversation \(SecurityError: [^\r\n]*\]\r?\n")
        p.expect(PROMPT)
        p.send("still there?\n")
        p.expect(SUMMARY)
        p.expect(PROMPT)
        p.send(f"/save {save}\n")
        p.expect(r"\[saved 4 messages to ")
        p.expect(PROMPT)
        p.send("\x04")
        assert p.wait() == 0
        assert b"Traceback" not in p.buf
    finally:
        p.kill()
    data = json.loads(save.read_text())
    assert [m["content"] for m in data["messages"] if m["role"] == "user"] == ["hello", "still there?"]
