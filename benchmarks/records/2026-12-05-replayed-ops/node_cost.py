"""What an operation in a compiled draft step costs to replay: the step timed with EXTRA pairs of
view operations (expand_dims, then index 0: the same values) added before each of the draft's 49
RMSNorm calls, in one process per setting.

    for e in 0 5 0 5; do EXTRA=$e python node_cost.py; done
"""
import os
import statistics
import time

import mlxspec
import mlx.core as mx
from mlxspec import api, lean_ops

EXTRA = int(os.environ.get("EXTRA", "0"))
_norm = lean_ops.LeanRMSNorm.__call__


def padded(self, x):
    for _ in range(EXTRA):
        x = mx.expand_dims(x, 0)[0]
    return _norm(self, x)


lean_ops.LeanRMSNorm.__call__ = padded
pair = mlxspec.load()
state = api.make_drafter(pair).state
hist = [1000 + (i * 37) % 5000 for i in range(300)]
state.prefill(hist)


def one():
    state.sync(hist)
    mx.eval(state.forward([hist[-1]]))


for _ in range(5):
    one()
times, end = [], time.time() + 15
while time.time() < end:
    t = time.perf_counter(); one(); times.append(time.perf_counter() - t)
print(f"EXTRA {EXTRA} (x 49 norms): median {statistics.median(times) * 1e3:.2f} ms, n {len(times)}")
