"""`mlxspec serve` as a local server apps can build on (issue 61): web pages on other
localhost ports get CORS (a preflight, Access-Control-Allow-Origin on replies),
`GET /v1/models/{id}` answers `openai`'s `models.retrieve`, /health tells the truth
while the models load, a full queue says when to retry, a queued client that hangs
up frees its place at once, a queued stream hears keep-alive comments, and fields
the server does not implement are a 400 naming them, never a silent 200."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import tiny_models
from server_process import MODEL, SMOLLM2, error_of, start

pytestmark = pytest.mark.real

openai = pytest.importorskip("openai", reason="the server tests need the `openai` package (pip install -e '.[test]')")

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Tell me a story about a dragon."}]
LONG = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]
APP = "http://app.example:3000"  # an --allowed-origins page
PAGE = "http://localhost:5173"  # a dev server's page on another localhost port


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(tmp_path_factory, "serve-apps", *SMOLLM2, "--num-draft-tokens", "3", "--max-queue", "1",
              "--parallel", "1",
              "--allowed-origins", APP, extra_env={"MLXSPEC_SSE_KEEPALIVE": "0.3"})
    yield s
    s.stop()


def stream_socket(server, messages, n, origin=None) -> socket.socket:
    """A raw streaming chat request, sent; the caller reads or closes it."""
    body = json.dumps({"messages": messages, "max_tokens": n, "stream": True}).encode()
    sock = socket.create_connection((server.host, server.port), timeout=60)
    extra = b"Origin: %s\r\n" % origin.encode() if origin else b""
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 + extra + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def wait_for(cond, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def busy(server):
    """A long generation running (its client reads nothing and hangs up at the end)."""
    server.wait_idle()
    sock = stream_socket(server, LONG, 2000)
    wait_for(lambda: server.health()["busy"], what="the long generation to start")
    yield sock
    sock.close()
    server.wait_idle(timeout=120)


# -- A: web clients -----------------------------------------------------------------------------------
def test_models_retrieve_with_openai_client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    m = client.models.retrieve(MODEL)
    assert (m.id, m.object, m.owned_by) == (MODEL, "model", "mlxspec")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.status_code == 404 and e.value.body["code"] == "model_not_found"
    status, body, _ = server.request("GET", "/v1/models/no%2Fsuch")
    assert error_of(status, body, 404)["param"] == "model"


@pytest.mark.parametrize("origin", [PAGE, "http://127.0.0.1:8000", APP])
def test_cors_preflight_for_allowed_origins(server, origin):
    status, body, headers = server.request("OPTIONS", CHAT, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization, x-stainless-os"})
    assert status == 204, (status, body)
    assert headers["Access-Control-Allow-Origin"] == origin and "Origin" in headers["Vary"]
    assert "POST" in headers["Access-Control-Allow-Methods"]
    asked = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"content-type", "authorization", "x-stainless-os"} <= asked
    assert int(headers["Access-Control-Max-Age"]) > 0
    # the request itself: its reply names the origin too, and so does an error for it
    status, body, headers = server.post(CHAT, {"messages": HI, "max_tokens": 4},
                                        headers={"Content-Type": "application/json", "Origin": origin})
    assert status == 200, body
    assert headers["Access-Control-Allow-Origin"] == origin and "Origin" in headers["Vary"]
    status, body, headers = server.request("GET", "/v1/models/gpt-4o", headers={"Origin": origin})
    assert status == 404 and headers["Access-Control-Allow-Origin"] == origin


def test_cors_is_refused_to_foreign_origins(server):
    for origin in ("http://evil.example", "null", "http://app.example:3001"):
        status, body, headers = server.request("OPTIONS", CHAT, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        error_of(status, body, 403)
        assert "Access-Control-Allow-Origin" not in headers
    status, _, headers = server.request("GET", "/v1/models")  # no Origin: not a browser; no CORS headers
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_a_cross_origin_stream_names_the_origin(server):
    server.wait_idle()
    with stream_socket(server, HI, 4, origin=PAGE) as sock:
        head = sock.makefile("rb").read().split(b"\r\n\r\n")[0].decode()
    assert head.split()[1] == "200"
    assert f"Access-Control-Allow-Origin: {PAGE}" in head.split("\r\n")


# -- C: the queue -----------------------------------------------------------------------------------------
def test_429_says_when_to_retry(server, busy):
    queued = stream_socket(server, HI, 4)
    wait_for(lambda: server.health()["queued"] == 1, what="the request to queue")
    status, body, headers = server.post(CHAT, {"messages": HI, "max_tokens": 4})
    assert error_of(status, body, 429)["code"] == "queue_full"
    assert int(headers["Retry-After"]) >= 1
    queued.close()


def test_a_queued_client_that_hangs_up_leaves_the_queue_at_once(server, busy):
    queued = stream_socket(server, HI, 4)
    wait_for(lambda: server.health()["queued"] == 1, what="the request to queue")
    queued.close()
    wait_for(lambda: server.health()["queued"] == 0, timeout=2, what="the queue to empty")
    h = server.health()
    assert h["busy"], h  # still on the long generation: the place was freed, not reached
    # and the freed place takes the next client instead of a 429
    nxt = stream_socket(server, HI, 4)
    wait_for(lambda: server.health()["queued"] == 1, what="the next request to queue")
    nxt.close()


def test_a_queued_stream_hears_keep_alive_comments(server, busy):
    with stream_socket(server, HI, 4) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().split()[1] == b"200"
        comments = 0
        deadline = time.monotonic() + 30
        while comments < 2 and time.monotonic() < deadline:
            line = reader.readline()
            assert line, "the stream ended"
            assert b'"content": "' not in line or b'"content": ""' in line, "queued, yet it generated"
            comments += line == b": keep-alive\n"
        assert comments >= 2
        assert server.health()["queued"] == 1


# -- D: fields the server does not implement --------------------------------------------------------------
UNSUPPORTED = [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),  # SmolLM2 has no tool format
    ("functions", [{"name": "f", "parameters": {}}]),
    ("best_of", 2),
    ("n", 2),
]


@pytest.mark.parametrize("field,value", UNSUPPORTED, ids=[f"{f}={json.dumps(v)[:20]}" for f, v in UNSUPPORTED])
def test_unsupported_fields_are_a_400_naming_them(server, field, value):
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 4, field: value})
    err = error_of(status, body, 400)
    assert err["param"] == field and f"'{field}'" in err["message"]
    assert "not supported by mlxspec serve" in err["message"]


def test_unsupported_fields_left_at_their_defaults_are_fine(server):
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 4, "tools": [], "logprobs": False,
                                         "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
                                         "response_format": {"type": "text"}, "n": 1, "tool_choice": None,
                                         "user": "someone"})
    assert status == 200, body
    assert body["choices"][0]["logprobs"] is None  # not asked for: none computed
    status, body, _ = server.post("/v1/completions", {"prompt": "Once", "max_tokens": 2, "logprobs": 21})
    assert error_of(status, body, 400)["param"] == "logprobs"
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2, "top_logprobs": 2})
    assert error_of(status, body, 400)["param"] == "top_logprobs"  # needs logprobs: true
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2, "logit_bias": {"49152": 1}})
    assert error_of(status, body, 400)["param"] == "logit_bias"  # past SmolLM2's vocabulary
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 2, "presence_penalty": 2.5})
    assert error_of(status, body, 400)["param"] == "presence_penalty"


# -- logprobs, penalties, logit_bias (openai client) -----------------------------------------------------
def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_logprobs_are_the_targets_and_drafting_changes_none(server):
    """Greedy: each token's logprob is its row's best, its tokens spell the reply, and the values
    equal a plain (num_draft_tokens 0) run's; streamed chunks carry the same entries."""
    c = _client(server)
    ask = dict(model=MODEL, max_tokens=12, messages=HI, logprobs=True, top_logprobs=3)
    r = c.chat.completions.create(**ask)
    plain = c.chat.completions.create(**ask, extra_body={"num_draft_tokens": 0})
    got, want = r.choices[0].logprobs.content, plain.choices[0].logprobs.content
    assert r.model_extra["speculative"]["accepted"] > 0
    assert "".join(t.token for t in got) == r.choices[0].message.content == plain.choices[0].message.content
    assert len(got) == r.usage.completion_tokens
    for a, b in zip(got, want):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-3
        assert bytes(a.bytes).decode() == a.token and len(a.top_logprobs) == 3
        assert a.top_logprobs[0].token == a.token and abs(a.top_logprobs[0].logprob - a.logprob) < 1e-6
        assert a.top_logprobs[0].logprob >= a.top_logprobs[1].logprob >= a.top_logprobs[2].logprob
    streamed = [t for ch in c.chat.completions.create(**ask, stream=True) if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in got]
    done = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, logprobs=2)
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens).lstrip() == done.choices[0].text.lstrip()  # mlx-lm's detokenizer drops a leading space
    assert len(lp.top_logprobs[0]) == 2
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(top[t] == v for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))


def test_penalties_and_bias_change_the_text_not_its_exactness(server):
    """With presence and frequency penalties the reply changes, and speculative = plain; a +100
    logit_bias makes that token the only one."""
    c = _client(server)
    base = c.chat.completions.create(model=MODEL, max_tokens=16, messages=HI)
    pen = dict(model=MODEL, max_tokens=16, messages=HI, presence_penalty=2.0, frequency_penalty=2.0)
    r = c.chat.completions.create(**pen)
    plain = c.chat.completions.create(**pen, extra_body={"num_draft_tokens": 0})
    assert r.choices[0].message.content == plain.choices[0].message.content != base.choices[0].message.content
    assert r.model_extra["speculative"]["drafted"] > 0
    forced = c.chat.completions.create(model=MODEL, max_tokens=4, messages=HI, logit_bias={"1000": 100},
                                       logprobs=True).choices[0].logprobs.content
    assert len({t.token for t in forced}) == 1 and all(t.logprob > -1e-3 for t in forced)  # +100: always that token


def test_json_schema_replies_are_valid_and_the_plain_runs(server):
    """response_format json_schema: the reply parses and follows the schema, and speculative =
    plain (the constraint masks target and draft alike); a schema keyword outside the subset is a
    400 naming it (json_object: tests/test_constrained_json.py)."""
    c = _client(server)
    schema = {"type": "object", "required": ["name", "age", "city"], "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
    ask = dict(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "Invent a person: name, age, city."}],
               response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    r = c.chat.completions.create(**ask)
    plain = c.chat.completions.create(**ask, extra_body={"num_draft_tokens": 0})
    text = r.choices[0].message.content
    assert text == plain.choices[0].message.content and r.choices[0].finish_reason == "stop"
    person = json.loads(text)
    assert set(person) == {"name", "age", "city"} and type(person["age"]) is int and isinstance(person["name"], str)
    assert r.model_extra["speculative"]["accepted"] > 0
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}
    status, body, _ = server.post(CHAT, {"messages": HI, "max_tokens": 4, "response_format": bad})
    err = error_of(status, body, 400)
    assert err["param"] == "response_format.json_schema.schema" and "'pattern'" in err["message"]


# -- B: honest start-up ----------------------------------------------------------------------------------
def test_health_says_loading_until_ready(tmp_path):
    target, draft = tiny_models.save_chatty_pair(tmp_path / "pair")  # loads in a second; its calibration, a few
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "MLXSPEC_API_KEY"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    # --num-draft auto: a calibration (the suite's calibration folder starts empty) follows the loading
    proc = subprocess.Popen([sys.executable, "-m", "mlxspec.cli", "serve", "--port", "0", "--model", str(target),
                             "--draft", str(draft)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        wait_for(lambda: any("health answers 503" in ln for ln in lines) or proc.poll() is not None, 120,
                 "the early line")
        early = next((ln for ln in lines if "health answers 503" in ln), None)
        assert early, lines
        url = early.split("; ")[1].split()[0].rsplit("/health", 1)[0]
        seen = []
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=30) as r:
                    seen.append((r.status, json.load(r)))
                    break
            except urllib.error.HTTPError as e:
                assert e.code == 503 and int(e.headers["Retry-After"]) >= 1
                seen.append((e.code, json.load(e)))
                if len(seen) == 1:  # a /v1 request meanwhile: 503 with Retry-After, not a hang
                    req = urllib.request.Request(url + CHAT, data=json.dumps({"messages": HI}).encode(),
                                                 headers={"Content-Type": "application/json"})
                    try:
                        urllib.request.urlopen(req, timeout=30).close()  # ready in between: fine
                    except urllib.error.HTTPError as post:
                        assert post.code == 503 and json.load(post)["error"]["code"] == "model_loading"
                        assert int(post.headers["Retry-After"]) >= 1
            time.sleep(0.02)
        loading = [b for s, b in seen if s == 503]
        assert loading, seen
        assert all(b["status"] == "loading" and b["phase"] in ("loading", "calibrating") and b["elapsed_s"] >= 0
                   for b in loading), loading
        assert seen[-1][0] == 200 and seen[-1][1]["status"] == "ok"
        assert proc.stdout.readline().startswith("mlxspec serve: listening on")  # printed once ready
        runs = []  # (status, phase, polls) in order
        for s, b in seen:
            if runs and tuple(runs[-1][:2]) == (s, b.get("phase")):
                runs[-1][2] += 1
            else:
                runs.append([s, b.get("phase"), 1])
        print("health while starting:", ", ".join(f"{s} {p or 'ok'} x{n}" for s, p, n in runs))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
