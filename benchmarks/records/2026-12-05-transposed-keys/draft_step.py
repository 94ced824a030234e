"""A compiled draft forward of the default draft, timed by width, for one revision:
    ROOT=<a checkout of mlxspec> WIDTHS=1,4,5,6,8 python draft_step.py
One process per revision, run alternately (runs.log).  350-400 cached positions
(capacity 512), 40 timed calls per width after 5 warm-up calls; median and minimum."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ["ROOT"])
import mlxspec  # noqa: E402
import mlx.core as mx  # noqa: E402
from mlxspec import api  # noqa: E402

pair = mlxspec.load()
state = api.make_drafter(pair).state
history = [1000 + (i * 37) % 5000 for i in range(400)]
state.prefill(history)
for width in [int(w) for w in os.environ.get("WIDTHS", "1,2,4").split(",")]:
    def one():
        pending = state.sync(history)
        mx.eval(state.forward(pending + [100 + j for j in range(width - 1)]))
    for _ in range(5):
        one()
    times = []
    for _ in range(40):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    print(f"{width} positions: median {statistics.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms")
