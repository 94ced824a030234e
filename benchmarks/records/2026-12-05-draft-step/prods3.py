import sys, time, statistics, os, collections
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api, packed_weights
pair = mlxspec.load()
d = api.make_drafter(pair)
m = d.state.model
lin = []
def walk(mod):
    if isinstance(mod, packed_weights.PackedLinear):
        lin.append(mod); return
    for k, v in mod.children().items():
        for x in (v if isinstance(v, list) else [v]):
            if hasattr(x, "children"): walk(x)
walk(m)
lin = [l for l in lin if l.out_dims < 100000]
print(len(lin))
base = None
for rows in (1, 2, 3, 4, 5, 6, 8, 12, 16):
    xs = [mx.random.normal((rows, l.in_dims)) for l in lin]; mx.eval(xs)
    def run(): mx.eval([l(x) for l, x in zip(lin, xs)])
    run(); run()
    ts = []
    for _ in range(15):
        t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
    t = statistics.median(ts); base = base or t
    print(rows, f"{t*1e3:.2f} ms  x{t/base:.2f}", flush=True)
