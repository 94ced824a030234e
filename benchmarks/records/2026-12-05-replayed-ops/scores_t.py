"""Attention scores against keys kept transposed, by the exact kernel of scores_t.patch (not applied in main):
24 (draft) or 28 (target) layers' scores at 512 positions, medians of 30, in ms; every result checked bit for
bit against the keys as stored.

    git worktree add /tmp/st ce146e2 && (cd /tmp/st && git apply /path/to/this/folder/scores_t.patch)
    PYTHONPATH=/tmp/st python scores_t.py

bt: q @ swapaxes(keys) (the kernel's transposed-B path, as main scores); scores_t: the patch's kernel on a
transposed copy; nn: q @ the transposed copy by the untransposed path (another summation order: what stop 45
tried)."""
import statistics
import time

import mlxspec  # noqa: F401  (the kernel before mlx.core)
import mlx.core as mx
import numpy as np
from mlxspec import kernel_ops

rng = np.random.default_rng(0)
for (H, G, M, D, T, layers) in [(2, 1, 7, 64, 512, 24), (2, 1, 28, 64, 512, 24), (2, 1, 6, 128, 512, 28),
                                (2, 6, 8, 128, 512, 28)]:
    qs = [mx.array(rng.standard_normal((1, H, G, M, D)).astype(np.float32)) for _ in range(layers)]
    ks = [mx.array(rng.standard_normal((1, H, 1, T, D)).astype(np.float32)) for _ in range(layers)]
    kts = [mx.contiguous(mx.swapaxes(k, -1, -2)) for k in ks]
    mx.eval(qs, ks, kts)
    ways = {"bt": lambda: [q @ mx.swapaxes(k, -1, -2) for q, k in zip(qs, ks)],
            "scores_t": lambda: [kernel_ops.scores_t(q, kt) for q, kt in zip(qs, kts)],
            "nn": lambda: [q @ kt for q, kt in zip(qs, kts)]}
    a, b = ways["bt"](), ways["scores_t"]()
    assert all(np.array_equal(np.array(x), np.array(y)) for x, y in zip(a, b))
    res = {}
    for name, f in ways.items():
        times = []
        for _ in range(30):
            t = time.perf_counter(); mx.eval(f()); times.append(time.perf_counter() - t)
        res[name] = round(statistics.median(times) * 1e3, 3)
    print(f"kv heads {H} x {G}, {M} rows, head dim {D}, {T} positions, {layers} layers: {res} ms (bit for bit)")
