"""A real `mlxspec serve` process on 127.0.0.1 (a free port), and small HTTP helpers for the server tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

MODEL = "smollm2-135m"
SMOLLM2 = ["--model", MODEL, "--draft", MODEL]  # SmolLM2-135M drafting for itself, as conftest's smollm2_pair


def need_smollm2():
    from mlxspec.models.pinned import fetch as weights

    if not weights.is_present(MODEL):
        pytest.skip("SmolLM2-135M is not in the cache (mlxspec pull smollm2-135m)")


class ServerProcess:
    def __init__(self, cwd, *args, api_key=None, extra_env=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "MLXSPEC_API_KEY"))}
        env.update(HF_HOME=str(cwd / "hf"), HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error",
                   PYTHONUNBUFFERED="1")
        env.update(extra_env or {})
        self.api_key = api_key
        extra = ["--api-key", api_key] if api_key else []
        self.stderr_path = cwd / "server.err"
        self.proc = subprocess.Popen([sys.executable, "-m", "mlxspec.cli", "serve", "--port", "0", *extra, *args],
                                     cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=open(self.stderr_path, "w"),
                                     text=True)
        line = self.proc.stdout.readline()  # "mlxspec serve: listening on http://127.0.0.1:PORT/ ..."
        if "listening on" not in line:
            self.proc.wait(timeout=30)
            raise AssertionError(f"the server did not start: {line!r} {self.stderr_path.read_text()}")
        self.url = line.split("listening on ")[1].split()[0].rstrip("/")
        self.host, self.port = urlsplit(self.url).hostname, urlsplit(self.url).port

    @property
    def pid(self) -> int:
        return self.proc.pid

    def headers(self, key: str | None = "default") -> dict:
        key = self.api_key if key == "default" else key
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def request(self, method: str, path: str, body=None, headers=None, timeout=120):
        """(status, parsed JSON or raw text, headers) of one request on a new connection."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=self.headers() if headers is None else headers)
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8")
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw
            return resp.status, parsed, dict(resp.getheaders())
        finally:
            conn.close()

    def post(self, path: str, body, **kw):
        return self.request("POST", path, body, **kw)

    def health(self) -> dict:
        status, body, _ = self.request("GET", "/health")
        assert status == 200, body
        return body

    def wait_idle(self, timeout=60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if not h["busy"] and h["queued"] == 0:
                return h
            time.sleep(0.05)
        raise AssertionError(f"the server stayed busy: {h}")

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self):
        """Ctrl-C: the server exits 130 with one 'interrupted' line, no traceback."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("the server did not stop on SIGINT")
        err = self.stderr_path.read_text()
        assert "Traceback" not in err, err
        assert self.proc.returncode == 130, (self.proc.returncode, err)


def start(tmp_path_factory, name, *args, api_key=None, extra_env=None) -> ServerProcess:
    need_smollm2()
    return ServerProcess(tmp_path_factory.mktemp(name), *args, api_key=api_key, extra_env=extra_env)


def start_tiny(tmp_path_factory, name, *args, extra_env=None) -> ServerProcess:
    """A real `mlxspec serve` of the tiny chatty pair (tests/tiny_models.py: loads in a second, never
    emits EOS); `.model` is the target's folder."""
    import tiny_models

    root = tmp_path_factory.mktemp(name)
    target, draft = tiny_models.save_chatty_pair(root / "pair")
    s = ServerProcess(root, "--model", str(target), "--draft", str(draft), *args, extra_env=extra_env)
    s.model = str(target)
    return s


def error_of(status: int, body, expect_status: int) -> dict:
    """The OpenAI-style error object of a response, checked."""
    assert status == expect_status, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"], err
    assert "Traceback" not in err["message"]
    return err


@pytest.fixture(scope="module")
def target():
    """The target alone (no draft), in this process: the reference greedy output."""
    import mlxspec

    need_smollm2()
    return mlxspec.load(MODEL, no_draft=True)
