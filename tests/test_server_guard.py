"""`mlxspec serve` against web pages, slow clients and crafted models (server/guard.py):
a foreign Host (DNS rebinding), a foreign Origin or a non-JSON POST (a page's no-preflight
`text/plain` form) is refused before anything runs; the server's own page still works;
ambiguous framing (two Content-Lengths, a GET with a body) is refused; a request must
arrive whole within --request-timeout, however slowly it trickles; a looping chat template
is stopped at that deadline and a panicking tokenizer is a one-line 500, with the server
serving on.  The server runs a tiny model whose template loops on the message "loop" and
whose tokenizer panics (Rust onig: retry-limit-in-match) on a long run of letters."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import threading
import time

import pytest

import tiny_models
from cli_util import assert_refused, run_cli
from server_process import ServerProcess, error_of

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
TIMEOUT = 2  # --request-timeout of the test server
LOOPING = ("{% if messages[-1]['content'] == 'loop' %}{% for i in range(100000) %}{% for j in range(100000) %}"
           "{% endfor %}{% endfor %}{% endif %}" + tiny_models.CHATML)
PANIC_REGEX = r"(\w|\w)*\d"  # exponential backtracking: onig gives up and the tokenizers crate panics


def crafted_model(root):
    """A tiny model folder with the looping template and the panicking pre-tokenizer."""
    plain = tiny_models.save_model_dir(root / "plain", "llama")
    folder = tiny_models.copy_with_chat_template(plain, root / "crafted", LOOPING)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["pre_tokenizer"]["pretokenizers"].insert(0, {"type": "Split", "pattern": {"Regex": PANIC_REGEX},
                                                     "behavior": "Isolated", "invert": False})
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # as tokenizer.json says (Qwen2Tokenizer rebuilds its own)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-guard")
    s = ServerProcess(root, "--model", str(crafted_model(root)), "--no-draft", "--request-timeout", str(TIMEOUT),
                      "--max-tokens", "4")
    yield s
    s.stop()


def served(server) -> int:
    return server.health()["served"]


def json_headers(**extra):
    return {"Content-Type": "application/json", **extra}


def raw_exchange(server, data: bytes, timeout=30) -> bytes:
    """Send raw bytes; everything the server sends until it closes."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def responses(reply: bytes) -> list[tuple[int, dict]]:
    """The (status, JSON body) of each response in `reply` (each has a Content-Length)."""
    out = []
    while reply:
        head, _, rest = reply.partition(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        out.append((int(head.split()[1]), json.loads(rest[:n])))
        reply = rest[n:]
    return out


# -- class 3: who may drive the server --------------------------------------------------------------
def test_foreign_host_is_refused(server):
    before = served(server)
    for host in ("evil.example", f"evil.example:{server.port}", f"rebind.attacker.test:{server.port}"):
        status, body, _ = server.post(CHAT, {"messages": HI}, headers=json_headers(Host=host))
        err = error_of(status, body, 403)
        assert err["code"] == "host_not_allowed" and "--allowed-hosts" in err["message"], err
        status, body, _ = server.request("GET", "/v1/models", headers={"Host": host})
        error_of(status, body, 403)
    assert served(server) == before  # nothing ran
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}", "LOCALHOST"):
        status, body, _ = server.request("GET", "/health", headers={"Host": host})
        assert status == 200, (host, body)


def test_foreign_origin_is_refused(server):
    before = served(server)
    for origin in ("http://evil.example", "https://evil.example:443", "null", f"http://evil.example:{server.port}"):
        status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2}, headers=json_headers(Origin=origin))
        err = error_of(status, body, 403)
        assert err["code"] == "origin_not_allowed" and "--allowed-origins" in err["message"], err
    assert served(server) == before
    for origin in (server.url, f"http://localhost:{server.port}", "http://localhost:3000", "http://127.0.0.1:5173"):
        status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2}, headers=json_headers(Origin=origin))
        assert status == 200, (origin, body)


def test_a_text_plain_post_is_refused(server):
    """What a page can send cross-site without a CORS preflight: the JSON as text/plain (or a form)."""
    before = served(server)
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None):
        headers = {} if ctype is None else {"Content-Type": ctype}
        status, got, _ = server.post(CHAT, body, headers=headers)
        err = error_of(status, got, 415)
        assert "application/json" in err["message"], err
    assert served(server) == before
    status, got, _ = server.post(CHAT, body, headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200, got


def test_the_chat_page_still_works(server):
    """The page at / posts JSON to /v1/chat/completions from its own origin, as a browser sends it."""
    status, page, _ = server.request("GET", "/", headers={"Host": f"localhost:{server.port}"})
    assert status == 200 and '<script src="/static/chat.js"' in page
    status, script, _ = server.request("GET", "/static/chat.js", headers={"Host": f"localhost:{server.port}"})
    assert status == 200 and '"Content-Type": "application/json"' in script
    headers = json_headers(Host=f"localhost:{server.port}", Origin=f"http://localhost:{server.port}")
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2, "stream": True}, headers=headers)
    assert status == 200 and "data: [DONE]" in body


# -- class 10 (server part): ambiguous framing -------------------------------------------------------
def test_duplicate_content_length_is_refused(server):
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    before = served(server)
    reply = raw_exchange(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\nContent-Length: 5\r\n\r\n%s"
                         % (len(body), body))
    [(status, got)] = responses(reply)
    assert "Content-Length" in error_of(status, got, 400)["message"]
    assert served(server) == before


def test_a_get_with_a_body_is_refused_and_closed(server):
    """The body would otherwise be read as a second request on the keep-alive connection."""
    inner = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    smuggled = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(inner), inner))
    before = served(server)
    reply = raw_exchange(server, b"GET /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(smuggled), smuggled))
    got = responses(reply)
    assert len(got) == 1, got  # one answer, then the connection closed: the body never ran
    assert "must not have a body" in error_of(*got[0], 400)["message"]
    reply = raw_exchange(server, b"GET /health HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"0\r\n\r\n")
    error_of(*responses(reply)[0], 400)
    assert served(server) == before


# -- class 5: a slow client --------------------------------------------------------------------------
def trickle(server, head: bytes, drip: bytes, every=0.25, give_up=TIMEOUT + 6) -> tuple[float, bytes]:
    """Send `head`, then one byte of `drip` every `every` s (more than the deadline's worth);
    (seconds until the server answered or closed, what it sent)."""
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(head)
        t0 = time.monotonic()
        s.settimeout(every)
        for i in range(int(give_up / every)):
            try:
                got = s.recv(65536)
            except TimeoutError:
                try:
                    s.sendall(drip[i % len(drip):][:1])
                except OSError:  # closed by the server
                    return time.monotonic() - t0, b""
                continue
            except OSError:
                return time.monotonic() - t0, b""
            elapsed = time.monotonic() - t0
            s.settimeout(5)
            while got and (more := s.recv(65536)):
                got += more
            return elapsed, got
    raise AssertionError(f"the server still held the connection after {give_up} s of trickling")


@pytest.mark.parametrize("head,drip", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n", b"X-Slow: abc\r\n"),
    (b"GET /heal", b"x"),  # the request line itself, never finished
], ids=["headers", "request line"])
def test_slow_headers_hit_the_whole_request_deadline(server, head, drip):
    elapsed, reply = trickle(server, head, drip)
    assert elapsed < TIMEOUT + 2, elapsed
    [(status, body)] = responses(reply)
    assert "--request-timeout" in error_of(status, body, 408)["message"]
    assert server.health()["status"] == "ok"
    assert "Error" not in server.stderr_path.read_text()


def test_a_slow_body_hits_the_whole_request_deadline(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 500\r\n\r\n{")
    elapsed, reply = trickle(server, head, b" ")
    assert elapsed < TIMEOUT + 2, elapsed
    error_of(*responses(reply)[0], 408)


# -- class 6: a crafted model ------------------------------------------------------------------------
def test_a_looping_chat_template_is_stopped(server):
    results = {}

    def looping():
        t0 = time.monotonic()
        results["loop"] = server.post(CHAT, {"messages": [{"role": "user", "content": "loop"}]})[:2]
        results["loop_s"] = time.monotonic() - t0

    t = threading.Thread(target=looping)
    t.start()
    time.sleep(0.5)
    assert server.health()["status"] == "ok"
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2})  # waits for the tokenizer, then runs
    t.join(timeout=60)
    assert not t.is_alive()
    assert status == 200, body
    err = error_of(*results["loop"], 500)
    assert err["code"] == "template_timeout" and "chat_template" in err["message"], err
    assert results["loop_s"] < TIMEOUT + 3, results
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2})  # the lock is free again
    assert status == 200, body


def test_a_tokenizer_panic_is_a_500(server):
    for path, body in (("/v1/completions", {"prompt": "x" * 200, "max_tokens": 2}),
                       (CHAT, {"messages": [{"role": "user", "content": "y" * 200}], "max_tokens": 2})):
        status, got, _ = server.post(path, body)
        err = error_of(status, got, 500)
        assert err["code"] == "tokenizer_failed" and "PanicException" in err["message"], err
    status, got, _ = server.post("/v1/completions", {"prompt": "a b c", "max_tokens": 2})
    assert status == 200, got
    assert "Traceback" not in server.stderr_path.read_text()


# -- class 5: out of file descriptors ----------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.linux_cpu  # Linux only: reads /proc
def test_at_the_descriptor_limit_the_server_refuses_without_spinning(server):
    server.wait_idle()
    time.sleep(TIMEOUT + 0.5)  # earlier tests' connections have closed
    fds = {int(n) for n in os.listdir(f"/proc/{server.pid}/fd")}
    lowest_free = next(i for i in range(len(fds) + 1) if i not in fds)
    soft, hard = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor left to accept with
    try:
        with socket.create_connection((server.host, server.port), timeout=10) as s:
            cpu0 = cpu_seconds(server.pid)
            time.sleep(2)  # the connection waits in the backlog (old code: accept() failed and was retried at once)
            spent = cpu_seconds(server.pid) - cpu0
            s.settimeout(5)
            reply = b""
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    reply += chunk
        assert spent < 0.5, f"the server spent {spent:.2f} s of CPU in 2 s at the descriptor limit"
        [(status, body)] = responses(reply)
        assert "file descriptors" in error_of(status, body, 503)["message"]
    finally:
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert server.health()["status"] == "ok"
    assert "out of file descriptors" in server.stderr_path.read_text()


# -- class 10 (server part): the API key -------------------------------------------------------------
@pytest.mark.parametrize("args,env,needle", [
    (["--api-key", ""], {}, "--api-key is empty"),
    (["--api-key", "  "], {}, "--api-key is empty"),
    ([], {"MLXSPEC_API_KEY": ""}, "MLXSPEC_API_KEY is set but empty"),
    (["--api-key-file", "empty.txt"], {}, "has no key on its first line"),
    (["--api-key-file", "/dev/null"], {}, "not a regular file"),
    (["--api-key-file", "missing.txt"], {}, "cannot read --api-key-file"),
    (["--api-key", "k", "--api-key-file", "key.txt"], {}, "not both"),
], ids=["empty", "blank", "empty env", "empty file", "device", "missing file", "both"])
def test_an_empty_or_unreadable_api_key_is_refused(tmp_path, args, env, needle):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "key.txt").write_text("k\n")
    res = run_cli(tmp_path, "serve", *args, "--model", "/nonexistent/model", timeout=60, **env)
    assert_refused(res, needle, exit_code=2)  # before anything loads: not "model not found"


@pytest.mark.linux_cpu  # Linux only: reads /proc
def test_the_api_key_from_a_file_stays_out_of_the_process_list(tmp_path):
    key = "s3cret-from-file"
    (tmp_path / "key.txt").write_text(key + "\nignored second line\n")
    s = ServerProcess(tmp_path, "--model", str(tiny_models.save_model_dir(tmp_path / "m", "llama")), "--no-draft",
                      "--api-key-file", str(tmp_path / "key.txt"))
    try:
        with open(f"/proc/{s.pid}/cmdline", "rb") as f:
            assert key.encode() not in f.read()
        error_of(*s.request("GET", "/v1/models", headers={})[:2], 401)
        status, body, _ = s.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert status == 200, body
    finally:
        s.stop()
