import sys, time, statistics, os
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import compiled_forward
from mlxspec.cache import ModelState
pair = mlxspec.load()
plain, fast = ModelState(pair.target), ModelState(pair.target)
print("unusable:", compiled_forward.unusable(fast), compiled_forward.attach(fast))
hist = [1000 + (i*37) % 5000 for i in range(300)]
for s in (plain, fast): s.prefill(hist)
res = {}
for r in range(4):
    for W in (1, 5):
        for name, s in (("plain", plain), ("compiled", fast)):
            def one():
                pending = s.sync(hist)
                lg = s.forward(pending + [100 + j for j in range(W)]); mx.eval(lg); return lg
            for _ in range(2): one()
            ts = []
            for _ in range(6):
                t0 = time.perf_counter(); one(); ts.append(time.perf_counter() - t0)
            res.setdefault((W, name), []).append(statistics.median(ts))
a = plain.forward(plain.sync(hist) + [100, 101, 102]); b = fast.forward(fast.sync(hist) + [100, 101, 102])
import numpy as np
print("max |diff|", float(mx.abs(a - b).max()), "argmax same", bool((mx.argmax(a, -1) == mx.argmax(b, -1)).all()))
for k, v in res.items():
    print(k, " ".join(f"{x*1e3:.1f}" for x in v))
