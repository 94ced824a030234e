"""The draft's two attention products for 24 layers (7 grouped query rows, 2 key heads), eager, median of 30:
the scores q @ keys.T and the values product, with and without the expand_dims lean_attention uses."""
import sys, time, statistics
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
for cap in (512, 4096):
    q5 = mx.random.normal((1, 2, 1, 7, 64)); q4 = q5.reshape(1, 2, 7, 64)
    ks = [mx.random.normal((1, 2, cap, 64)) for _ in range(24)]; vs = [mx.random.normal((1, 2, cap, 64)) for _ in range(24)]
    mx.eval(q5, q4, ks, vs)
    fns = {
      "qk 5d expand": lambda: [q5 @ mx.swapaxes(mx.expand_dims(k, -3), -1, -2) for k in ks],
      "qk 4d": lambda: [q4 @ mx.swapaxes(k, -1, -2) for k in ks],
      "pv 5d expand": lambda: [mx.ones((1, 2, 1, 7, cap)) @ mx.expand_dims(v, -3) for v in vs],
      "pv 4d": lambda: [mx.ones((1, 2, 7, cap)) @ v for v in vs],
    }
    for name, f in fns.items():
        g = f
        mx.eval(g()); ts = []
        for _ in range(30):
            t0 = time.perf_counter(); mx.eval(g()); ts.append(time.perf_counter() - t0)
        print(cap, f"{name:14s} {statistics.median(ts)*1e3:.2f} ms / 24")
