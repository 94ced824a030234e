"""`mlxspec serve --parallel N` (issue 61): several clients decode at once, each stream with its own
decoder and its own draft/verify rounds, interleaved round by round.  Real concurrent clients (the
`openai` package streaming, http.client) on the tiny pair: every reply is exactly the one it gets alone
(greedy, and seeded sampling through the coupled sampler), the streams really overlap (/health saw them
together), a client that hangs up frees its slot at once while the others run on untouched, and a
follow-up chat turn lands on the slot whose cache holds its conversation."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

import tiny_models
from server_process import start_tiny

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
N = 160  # tokens per reply: long enough for the streams to overlap, short enough to stay cheap
REQUESTS = [  # (prompt, extra fields): greedy and seeded, several draft lengths
    ("w1 w2 w3", {"num_draft_tokens": 3}),
    ("w7 w7 w9", {"num_draft_tokens": 2}),
    ("w40 w41", {"temperature": 0.9, "seed": 5, "num_draft_tokens": 3}),
    ("w5 w6 w5", {"temperature": 0.8, "top_p": 0.9, "seed": 11, "num_draft_tokens": 2}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_tiny(tmp_path_factory, "serve-parallel", "--num-draft-tokens", "3", "--parallel", "3")
    yield s
    s.stop()


def body(prompt, n=N, **extra):
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, **extra}


def text_of(server, b) -> str:
    status, reply, _ = server.post(CHAT, b)
    assert status == 200, reply
    return reply["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def alone(server):
    """Each request's reply alone, decoded plainly (no draft): the target's own output."""
    return [text_of(server, body(p, **{**extra, "num_draft_tokens": 0})) for p, extra in REQUESTS]


class Watch:
    """Polls /health while clients run: the most streams seen decoding at once."""

    def __init__(self, server):
        self.server, self.peak, self.stop = server, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            h = self.server.health()
            self.peak = max(self.peak, h["active"])
            assert len(h["streams"]) == h["active"] <= h["parallel"] == 3, h
            time.sleep(0.01)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def openai_stream(server, b) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    fields = {k: v for k, v in b.items() if k in ("temperature", "top_p", "seed")}
    extra = {k: v for k, v in b.items() if k not in fields and k not in ("messages", "max_tokens")}
    out = []
    for chunk in client.chat.completions.create(model=server.model, messages=b["messages"], max_tokens=b["max_tokens"],
                                                stream=True, extra_body=extra, **fields):
        if chunk.choices and chunk.choices[0].delta.content:
            out.append(chunk.choices[0].delta.content)
    return "".join(out)


def test_concurrent_replies_are_each_exactly_their_own(server, alone):
    server.wait_idle()
    results = [None] * len(REQUESTS)
    barrier = threading.Barrier(len(REQUESTS))

    def client(i):
        prompt, extra = REQUESTS[i]
        barrier.wait()
        b = body(prompt, **extra)
        results[i] = openai_stream(server, b) if i % 2 else text_of(server, b)

    watch = Watch(server)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = watch.done()
    assert peak >= 2, "the streams never decoded together"
    for i, (got, want) in enumerate(zip(results, alone)):
        assert got == want, (i, REQUESTS[i])  # greedy = the target's argmax; seeded = the plain run's tokens
    assert len(set(alone)) == len(alone)  # four different replies: a mix-up would show
    stats = server.request("GET", "/stats")[1]
    assert stats["active"] == 0 and stats["generated_tokens"] >= len(REQUESTS) * N * 2
    assert len(stats["slots"]) == 3 and all(s["cached_tokens"] > N for s in stats["slots"]), stats


def stream_socket(server, b) -> socket.socket:
    data = json.dumps({**b, "stream": True}).encode()
    sock = socket.create_connection((server.host, server.port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def test_a_client_that_hangs_up_leaves_the_others_untouched(server, alone):
    server.wait_idle()
    long = 3000
    victim = stream_socket(server, body("w9 w9 w8", long))
    reader = victim.makefile("rb")
    assert reader.readline().split()[1] == b"200"
    result = []
    survivor = threading.Thread(target=lambda: result.append(text_of(server, body(*REQUESTS[0][:1],
                                                                                  **REQUESTS[0][1]))))
    survivor.start()
    pieces = 0
    while pieces < 5:
        line = reader.readline()
        assert line, "the stream ended early"
        pieces += line.startswith(b"data: {") and b'"content": "' in line and b'"content": ""' not in line

    def victim_running():
        return any(s["max_tokens"] == long for s in server.health()["streams"])

    assert victim_running()
    reader.close()
    victim.close()  # hang up
    t0 = time.monotonic()
    while victim_running():
        assert time.monotonic() - t0 < 2, "the hung-up stream kept its slot"
        time.sleep(0.01)
    survivor.join()
    assert result == [alone[0]]


def chat(server, messages, n=24):
    status, reply, _ = server.post(CHAT, {"messages": messages, "max_tokens": n})
    assert status == 200, reply
    return reply["choices"][0]["message"]["content"], reply["usage"]


def test_a_follow_up_turn_lands_on_its_conversations_cache(server):
    server.wait_idle()
    convs = [[{"role": "user", "content": p}] for p in ("w11 w12 w13 w14", "w21 w22 w23 w24", "w31 w32 w33")]
    first = [None] * len(convs)
    barrier = threading.Barrier(len(convs))

    def turn1(i):
        barrier.wait()
        first[i] = chat(server, convs[i], 60)

    threads = [threading.Thread(target=turn1, args=(i,)) for i in range(len(convs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (1, 0, 2):  # one at a time, in another order: each must find its own conversation's slot
        reply, usage1 = first[i]
        follow = convs[i] + [{"role": "assistant", "content": reply}, {"role": "user", "content": "w5 w6"}]
        _, usage = chat(server, follow, 4)
        # its first turn's prompt was still cached (another slot shares only the template's opening tokens;
        # the reply's text may tokenize differently from the tokens generated, so it need not be reused)
        assert usage["prompt_tokens_details"]["cached_tokens"] >= usage1["prompt_tokens"], (i, usage1, usage)


def test_default_parallel_is_sized_by_memory():
    from types import SimpleNamespace

    from mlxspec.device import is_gpu
    from mlxspec.models.memory import kv_cache_bytes
    from mlxspec.server.scheduler import MAX_DEFAULT_PARALLEL, default_parallel

    cfg = tiny_models.config_for(max_pos=4096)
    pair = SimpleNamespace(target_config=cfg, draft_config=cfg, target=None, draft=None, context_length=4096)
    per = 2 * kv_cache_bytes(cfg, 4096, 2 if is_gpu() else 4)  # target and draft
    assert default_parallel(pair, usable=per // 2)[0] == 1  # not even one fits: still one stream
    assert default_parallel(pair, usable=2 * per + 1)[0] == 2
    assert default_parallel(pair, usable=100 * per)[0] == MAX_DEFAULT_PARALLEL
    assert default_parallel(pair, max_kv_size=1024, usable=2 * per + 1)[0] == MAX_DEFAULT_PARALLEL  # a bounded cache


def test_each_turn_is_one_round_of_every_stream(tiny_pair):
    """In process: a sweep of the engine gives every running stream exactly one draft/verify round (not a
    token, not a whole reply), and each reply is still the target's own."""
    from mlxspec import api
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.server.engine import Engine, Job

    def make():
        return api.make_decoder(tiny_pair, num_draft=3)

    engine = Engine(tiny_pair, make(), 3, max_queue=4, parallel=2, make_decoder=make)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]  # three jobs, two slots: the third waits its turn
    jobs = [Job(list(p), SamplingParams(), 24, [], None) for p in prompts]
    for j in jobs:
        engine.submit(j)
    sweeps = []
    while engine.active or engine.waiting:
        before = [j.stats.target_passes if j.stats is not None else None for j in jobs]
        running = [r.job for r in engine.active]
        engine.sweep()
        sweeps.append([(b, j.stats.target_passes if j.stats is not None else None, j in running)
                       for j, b in zip(jobs, before)])
    assert any(s[0][1] and s[1][1] and s[0][2] and s[1][2] for s in sweeps)  # the two ran side by side
    for s in sweeps:
        for before, after, was_running in s:
            if was_running:
                assert after - before <= 1, sweeps  # at most one round a turn
    for j, p in zip(jobs, prompts):
        events = []
        while not j.events.empty():
            events.append(j.events.get())
        assert events[-1][0] == "done", events
        stats = events[-1][1]
        # a stream that was running did a round in every sweep until it finished
        turns = [s[jobs.index(j)] for s in sweeps if s[jobs.index(j)][2]]
        assert all(after - before == 1 for before, after, _ in turns[:-1]), turns
        want = api.generate(tiny_pair, list(p), max_tokens=24, drafter="none").tokens
        assert stats.generated_tokens == len(want)
        assert "".join(e[1] for e in events if e[0] == "text") == tiny_pair.tokenizer.decode(want)
