"""`mlxspec serve` under bad input and pressure: every malformed request gets an
OpenAI-style JSON error with a 4xx status and the server stays healthy; a full
queue answers 429; a client that hangs up mid-stream cancels its generation
within one round and the next request's output is a fresh server's."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from mlxspec import api

from cli_util import assert_refused, run_cli
from server_process import MODEL, SMOLLM2, error_of, start, target  # noqa: F401 (target: a fixture)

pytestmark = pytest.mark.real

MAX_BODY = 65536
CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Tell me a story about a dragon."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(tmp_path_factory, "serve-errors", *SMOLLM2, "--num-draft-tokens", "3", "--max-queue", "2",
              "--parallel", "1",
              "--max-request-bytes", str(MAX_BODY))
    yield s
    s.stop()


def reference(target, messages, n):
    return api.generate(target, messages, max_tokens=n, drafter="none").text


def chat_text(server, messages=HI, n=12, **extra):
    status, body, _ = server.post(CHAT, {"messages": messages, "max_tokens": n, **extra})
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


BAD = [  # (name, path, body, status, param)
    ("malformed JSON", CHAT, b'{"messages": [', 400, None),
    ("not UTF-8", CHAT, b'\xff\xfe{"messages": 1}', 400, None),
    ("not an object", CHAT, [1, 2], 400, None),
    ("lone surrogate", CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, None),
    ("lone surrogate in a prompt", "/v1/completions", b'{"prompt": "a\\ud800b"}', 400, None),
    ("unknown model", CHAT, {"model": "gpt-4o", "messages": HI}, 404, "model"),
    ("missing messages", CHAT, {"max_tokens": 4}, 400, "messages"),
    ("messages not a list", CHAT, {"messages": "hello"}, 400, "messages"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("message not an object", CHAT, {"messages": ["hello"]}, 400, "messages[0]"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("content a number", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("image content", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content"),
    ("temperature a string", CHAT, {"messages": HI, "temperature": "hot"}, 400, "temperature"),
    ("negative temperature", CHAT, {"messages": HI, "temperature": -1}, 400, "temperature"),
    ("top_p 0", CHAT, {"messages": HI, "top_p": 0}, 400, "top_p"),
    ("max_tokens 0", CHAT, {"messages": HI, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", CHAT, {"messages": HI, "max_tokens": -3}, 400, "max_tokens"),
    ("max_tokens a float", CHAT, {"messages": HI, "max_tokens": 2.5}, 400, "max_tokens"),
    ("max_tokens a bool", CHAT, {"messages": HI, "max_tokens": True}, 400, "max_tokens"),
    ("max_completion_tokens 0", CHAT, {"messages": HI, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("max_tokens beyond the context", CHAT, {"messages": HI, "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ("n = 2", CHAT, {"messages": HI, "n": 2}, 400, "n"),
    ("stream not a bool", CHAT, {"messages": HI, "stream": "yes"}, 400, "stream"),
    ("stop a number", CHAT, {"messages": HI, "stop": 7}, 400, "stop"),
    ("too many stops", CHAT, {"messages": HI, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("bad num_draft_tokens", CHAT, {"messages": HI, "num_draft_tokens": 99}, 400, "num_draft_tokens"),
    ("stream_options not an object", CHAT, {"messages": HI, "stream_options": 1}, 400, "stream_options"),
    ("missing prompt", "/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("prompt a number", "/v1/completions", {"prompt": 12}, 400, "prompt"),
    ("token id out of range", "/v1/completions", {"prompt": [1, 2, 10 ** 7]}, 400, "prompt"),
    ("negative token id", "/v1/completions", {"prompt": [1, -2]}, 400, "prompt"),
    ("prompt longer than the context", "/v1/completions", {"prompt": [1] * 9000}, 400, "messages"),
    ("text prompt longer than the context", CHAT, {"messages": [{"role": "user", "content": "word " * 9000}]}, 400,
     "messages"),
    ("oversized body", CHAT, {"messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}, 413, None),
    ("unknown endpoint", "/v1/embeddings", {"input": "hi"}, 404, None),
]


@pytest.mark.parametrize("name,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_malformed_request_is_a_json_error(server, name, path, body, status, param):
    code, got, _ = server.post(path, body if isinstance(body, bytes) else json.dumps(body).encode())
    err = error_of(code, got, status)
    assert err["param"] == param, err
    assert server.health()["status"] == "ok"


def raw(server, data: bytes) -> tuple[int, dict]:
    """Send raw bytes, read the whole reply (the server closes after an error)."""
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    if not reply.startswith(b"HTTP/"):  # an HTTP/0.9-style request gets a bare body, as HTTP/0.9 has no status line
        return None, json.loads(reply)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_malformed_http_is_a_json_error(server, target):
    before = chat_text(server)
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    status, body = raw(server, post + b"\r\n")  # no Content-Length
    error_of(status, body, 411)
    status, body = raw(server, post + b"Content-Length: 99999999999\r\n\r\n")
    error_of(status, body, 413)  # refused from the header, without reading a byte of the body
    status, body = raw(server, post + b"Content-Length: ten\r\n\r\n")
    error_of(status, body, 400)
    status, body = raw(server, b"GARBAGE\r\n\r\n")
    assert body["error"]["code"] == "400"
    status, body = raw(server, b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n")
    error_of(status, body, 431)
    status, body, _ = server.request("DELETE", "/v1/models")
    error_of(status, body, 405)
    # still healthy, and still the target's greedy output
    assert chat_text(server) == before == reference(target, HI, 12)


def test_full_queue_answers_429(server, target):
    server.wait_idle()
    n = 8
    barrier = threading.Barrier(n)
    results = [None] * n

    def client(i):
        barrier.wait()
        results[i] = server.post(CHAT, {"messages": HI, "max_tokens": 16})[:2]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [b for s, b in results if s == 200]
    busy = [b for s, b in results if s == 429]
    assert len(ok) + len(busy) == n, results
    assert 3 <= len(ok) < n and busy  # one running and two queued at least; the rest refused at once
    for b in busy:
        assert error_of(429, b, 429)["type"] == "rate_limit_error"
    expected = reference(target, HI, 16)
    assert all(b["choices"][0]["message"]["content"] == expected for b in ok)
    assert server.wait_idle()["status"] == "ok"


def test_disconnect_mid_stream_cancels_within_one_round(server, target):
    server.wait_idle()
    body = json.dumps({"messages": HI, "max_tokens": 400, "stream": True}).encode()
    sock = socket.create_connection((server.host, server.port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    reader = sock.makefile("rb")
    assert reader.readline().split()[1] == b"200"
    pieces = 0
    while pieces < 3:
        line = reader.readline()
        assert line, "the stream ended early"
        if line.startswith(b"data: {") and b'"content": "' in line and b'"content": ""' not in line:
            pieces += 1
    reader.close()
    sock.close()  # hang up mid-stream
    last = server.wait_idle()["last_generation"]
    assert last["finish_reason"] == "cancelled", last
    assert last["rounds_after_cancel"] is not None and last["rounds_after_cancel"] <= 1, last
    assert last["completion_tokens"] < 400
    # the next requests (the same conversation, whose prefix the caches hold, and another) are a fresh server's
    assert chat_text(server, HI, 16) == reference(target, HI, 16)
    other = [{"role": "user", "content": "What is two plus two?"}]
    assert chat_text(server, other, 12) == reference(target, other, 12)


def test_non_loopback_host_needs_an_api_key(tmp_path):
    res = run_cli(tmp_path, "serve", "--host", "0.0.0.0", "--model", "/nonexistent/model", timeout=60)
    assert_refused(res, "--api-key", "--insecure", "0.0.0.0")


def test_a_port_in_use_is_one_line_before_loading(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_cli(tmp_path, "serve", "--port", str(port), "--model", "/nonexistent/model", timeout=60)
    assert_refused(res, f"cannot listen on 127.0.0.1:{port}")  # not "model not found": nothing slow ran first
