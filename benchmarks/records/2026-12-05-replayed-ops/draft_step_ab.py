"""A compiled draft step of the default pair, timed in two checkouts of mlxspec, alternating processes.

    python draft_step_ab.py BASE_TREE NEW_TREE [--pairs 3] [--width 1] [--seconds 12]

Each process loads the pair from its tree (PYTHONPATH), prefills 300 tokens, and times the
draft's forward over `width` positions at the same place again and again (warm, 5 untimed first)
for `seconds`: the median and minimum in ms.  Processes alternate base / new, `pairs` times."""
import argparse
import os
import subprocess
import sys

INNER = r"""
import os, statistics, time
import mlxspec
import mlx.core as mx
from mlxspec import api
pair = mlxspec.load()
state = api.make_drafter(pair).state
hist = [1000 + (i * 37) % 5000 for i in range(300)]
state.prefill(hist)
w = int(os.environ["W"])
def one():
    state.sync(hist)
    mx.eval(state.forward([hist[-1]] + [100 + j for j in range(w - 1)]))
for _ in range(5):
    one()
times, end = [], time.time() + float(os.environ["SECS"])
while time.time() < end:
    t = time.perf_counter(); one(); times.append(time.perf_counter() - t)
print(f"n {len(times)} median {statistics.median(times) * 1e3:.2f} ms min {min(times) * 1e3:.2f} ms")
"""

ap = argparse.ArgumentParser()
ap.add_argument("base"), ap.add_argument("new")
ap.add_argument("--pairs", type=int, default=3)
ap.add_argument("--width", type=int, default=1)
ap.add_argument("--seconds", type=float, default=12)
a = ap.parse_args()
for i in range(a.pairs):
    for name, tree in (("base", a.base), ("new", a.new)):
        env = {**os.environ, "PYTHONPATH": tree, "W": str(a.width), "SECS": str(a.seconds)}
        out = subprocess.run([sys.executable, "-c", INNER], env=env, capture_output=True, text=True)
        print(f"pair {i + 1} {name:4} width {a.width}: {out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]}",
              flush=True)
