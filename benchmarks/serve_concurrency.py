"""`mlxspec serve` with several clients at once: --parallel N against one generation at a time.

    python benchmarks/serve_concurrency.py                      # SmolLM2-135M drafting for itself, 3 repeats
    python benchmarks/serve_concurrency.py --repeats 5 --max-tokens 96 --clients 1 2 4

Two servers on 127.0.0.1, both up: `--parallel 1` (one generation at a time, the others queued: the server
before issue 61) and `--parallel MAX(clients)`.  C clients (C in --clients) send a streamed greedy chat request
together, each its own prompt; a round of C requests is timed from the first send to the last [DONE].  Each
repeat runs every C against both servers in turn (the order alternating by repeat), so a machine shared with
other jobs loads both alike.  Reported per server and C, median and range over the repeats: aggregate tokens/s (all
completion tokens over the round's wall time) and time to first token (median over the round's clients, and
the slowest client's).  Every reply is checked against the same prompt's reply from the one-at-a-time server's
warm-up (concurrency must not change a token): a difference is printed and counted.  A warm-up round of every prompt precedes the timed rounds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain in three sentences why the sky is blue.",
           "List five fruits and one fact about each.",
           "Write a haiku about a cache that remembers everything.",
           "What is the difference between a list and a tuple in Python?",
           "Describe a quiet morning in a small town.",
           "Give three tips for writing clear commit messages.",
           "Summarise the plot of a story about a lost key."]


class Server:
    def __init__(self, args, parallel: int):
        self.dir = tempfile.mkdtemp(prefix="mlxspec-bench-serve-")
        cmd = [sys.executable, "-m", "mlxspec.cli", "serve", "--port", "0", "--model", args.model, "--draft",
               args.draft, "--parallel", str(parallel), "--max-queue", "64"]
        if args.num_draft is not None:
            cmd += ["--num-draft-tokens", args.num_draft]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(Path(self.dir) / "err", "w"),
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            err = (Path(self.dir) / "err").read_text()[-2000:]
            shutil.rmtree(self.dir, ignore_errors=True)
            raise SystemExit(f"the server did not start: {err}")
        url = urlsplit(line.split("listening on ")[1].split()[0])
        self.host, self.port = url.hostname, url.port

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def stream(server, prompt, max_tokens, out, i, t0):
    """One streamed greedy chat request: (text, completion tokens, seconds to the first text, end time)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    text, first, tokens = [], None, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
            if first is None:
                first = time.monotonic() - t0
            text.append(ev["choices"][0]["delta"]["content"])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    conn.close()
    out[i] = ("".join(text), tokens, first, time.monotonic())


def round_of(server, prompts, max_tokens):
    out = [None] * len(prompts)
    t0 = time.monotonic()
    threads = [threading.Thread(target=stream, args=(server, p, max_tokens, out, i, t0)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(o[3] for o in out) - t0
    return out, wall


def spread(xs, fmt="{:.1f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--num-draft", default=None, help="the servers' --num-draft-tokens (default: auto)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    top = max(args.clients)
    servers = {1: Server(args, 1), top: Server(args, top)}  # both up at once: rounds alternate between them
    reference: dict = {}
    mismatches: list = []
    rows = {(n, c): {"parallel": n, "clients": c, "tps": [], "ttft": [], "ttft_worst": []}
            for n in servers for c in args.clients}
    try:
        for n, server in servers.items():
            for p in PROMPTS[:top]:  # warm-up, one at a time; the first server's replies are the reference
                out, _ = round_of(server, [p], args.max_tokens)
                if reference.setdefault(p, out[0][0]) != out[0][0]:
                    mismatches.append((n, 1, p))
                    print(f"MISMATCH in the warm-up of --parallel {n}: {p!r}", flush=True)
        for r in range(args.repeats):
            for c in args.clients:
                prompts = [PROMPTS[(r + i) % top] for i in range(c)]
                order = list(servers) if r % 2 == 0 else list(servers)[::-1]  # the same load for both, in turn
                for n in order:
                    out, wall = round_of(servers[n], prompts, args.max_tokens)
                    for p, o in zip(prompts, out):
                        if o[0] != reference[p]:
                            mismatches.append((n, c, p))
                            print(f"MISMATCH --parallel {n}, {c} clients, {p!r}", flush=True)
                    row = rows[n, c]
                    row["tps"].append(sum(o[1] for o in out) / wall)
                    row["ttft"].append(statistics.median(o[2] for o in out))
                    row["ttft_worst"].append(max(o[2] for o in out))
                print(f"repeat {r + 1}, {c} client(s): " + ", ".join(
                    f"--parallel {n} {rows[n, c]['tps'][-1]:.1f} tok/s, TTFT {rows[n, c]['ttft'][-1]:.2f} s "
                    f"(slowest {rows[n, c]['ttft_worst'][-1]:.2f} s)" for n in servers), flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(f"\n| clients | tok/s, one at a time | tok/s, --parallel {top} | TTFT s, one at a time: median / slowest "
          f"client | TTFT s, --parallel {top}: median / slowest client |")
    print("|---|---|---|---|---|")
    for c in args.clients:
        a, b = rows[1, c], rows[top, c]
        t = "{:.2f}"
        print(f"| {c} | {spread(a['tps'])} | {spread(b['tps'])} | {spread(a['ttft'], t)} / {spread(a['ttft_worst'], t)} | "
              f"{spread(b['ttft'], t)} / {spread(b['ttft_worst'], t)} |")
    print(f"\nreplies that differed from the reference: {len(mismatches)}")
    if args.json:
        Path(args.json).write_text(json.dumps(list(rows.values()), indent=1))


if __name__ == "__main__":
    main()
