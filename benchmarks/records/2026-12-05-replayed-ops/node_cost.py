"""What an operation in a compiled draft step costs to replay: the step timed with EXTRA pairs of
view operations (expand_dims, then index 0: the same values) added before each of the draft's 49
RMSNorm calls, in one process per setting (step_loop.py's loop, 15 s).

    for e in 0 5 0 5; do EXTRA=$e python node_cost.py; done
"""
import os
import statistics

import mlxspec  # noqa: F401  (the kernel before mlx.core)
import mlx.core as mx
from mlxspec import lean_ops
from step_loop import timed

EXTRA = int(os.environ.get("EXTRA", "0"))
_norm = lean_ops.LeanRMSNorm.__call__


def padded(self, x):
    for _ in range(EXTRA):
        x = mx.expand_dims(x, 0)[0]
    return _norm(self, x)


lean_ops.LeanRMSNorm.__call__ = padded
times = timed(15)
print(f"EXTRA {EXTRA} (x 49 norms): median {statistics.median(times) * 1e3:.2f} ms, n {len(times)}")
