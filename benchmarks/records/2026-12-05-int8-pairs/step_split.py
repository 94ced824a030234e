"""A compiled draft step over one position, split: making the compiled call (lazy) and evaluating it,
medians of 200 steps after 5 warm ones (the default pair; set GOMP_SPINCOUNT, OMP_WAIT_POLICY or
OMP_NUM_THREADS before it starts to compare OpenMP's settings).

    PYTHONPATH=TREE python step_split.py
"""
import statistics
import time

import mlxspec
import mlx.core as mx
from mlxspec import api

state = api.make_drafter(mlxspec.load()).state
hist = [1000 + (i * 37) % 5000 for i in range(300)]
state.prefill(hist)


def step(build, evaluate):
    state.sync(hist)
    t0 = time.perf_counter()
    logits = state.forward([hist[-1]])
    t1 = time.perf_counter()
    mx.eval(logits)
    build.append(t1 - t0)
    evaluate.append(time.perf_counter() - t1)


for _ in range(5):
    step([], [])
build, evaluate = [], []
for _ in range(200):
    step(build, evaluate)
med = statistics.median
print(f"build {med(build) * 1e3:.2f} ms, eval {med(evaluate) * 1e3:.2f} ms, "
      f"total {med([a + b for a, b in zip(build, evaluate)]) * 1e3:.2f}")
