"""A bounded load test of `mlxspec serve` on loopback: 4 clients x 6 requests on
SmolLM2 with short outputs, streamed and not.  No error other than 429, every
answer is its own request's (each client has its own prompt, checked against
the target's greedy output), and the server's memory stays flat."""

from __future__ import annotations

import json
import threading
import time

import pytest

import mlxspec
from mlxspec import api

from server_process import MODEL, SMOLLM2, error_of, need_smollm2, start

pytestmark = [pytest.mark.real, pytest.mark.linux_cpu]  # linux_cpu: its memory figure reads /proc

CLIENTS, REQUESTS, N = 4, 6, 2  # 2 tokens: the four prompts still get four different answers
PROMPTS = ["The capital of Italy is", "def square(x):", "Once upon a time, a fox", "1, 2, 3, 4,"]
RSS_GROWTH_LIMIT = 64 * 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(tmp_path_factory, "serve-load", *SMOLLM2, "--num-draft-tokens", "3", "--max-queue", "3")
    yield s
    s.stop()


def completion(server, prompt, stream):
    """(status, text or error body, response id)."""
    status, body, _ = server.post("/v1/completions", {"prompt": prompt, "max_tokens": N, "stream": stream,
                                                      "model": MODEL})
    if status != 200:
        return status, body, None
    if not stream:
        return status, body["choices"][0]["text"], body["id"]
    events = [ln[6:] for ln in body.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]", body
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1  # one response, not pieces of several
    return status, "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks[0]["id"]


def test_four_clients_six_requests_each(server):
    need_smollm2()
    target = mlxspec.load(MODEL, no_draft=True)
    expected = [api.generate(target, p, max_tokens=N, drafter="none", chat_template=False).text for p in PROMPTS]
    del target
    for p, e in zip(PROMPTS, expected):  # warm-up, one at a time
        assert completion(server, p, False)[1] == e
    rss_before = server.rss_bytes()

    results = [[] for _ in range(CLIENTS)]
    barrier = threading.Barrier(CLIENTS)

    def client(i):
        barrier.wait()
        for r in range(REQUESTS):
            results[i].append(completion(server, PROMPTS[i], stream=bool(r % 2)))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    rss_after = server.rss_bytes()

    ids, ok, busy = set(), 0, 0
    for i, answers in enumerate(results):
        assert len(answers) == REQUESTS  # nothing lost
        for status, text, rid in answers:
            if status == 429:
                assert error_of(status, text, 429)["code"] == "queue_full"
                busy += 1
                continue
            assert status == 200, text
            assert text == expected[i], (i, text)  # its own prompt's answer, not another client's
            assert rid not in ids
            ids.add(rid)
            ok += 1
    assert ok + busy == CLIENTS * REQUESTS and ok >= REQUESTS
    health = server.wait_idle()
    assert health["status"] == "ok"
    print(f"\nload: {CLIENTS} clients x {REQUESTS} requests, {N} tokens each: {ok} answered, {busy} x 429, "
          f"{elapsed:.1f} s; server RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, (rss_before, rss_after)
