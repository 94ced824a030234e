"""Is a target pass slower right after a draft forward than right after another target pass?"""
import sys, time, statistics
sys.path.insert(0, "/work/main")
import mlxspec, mlx.core as mx
from mlxspec import api
from mlxspec.cache import ModelState
pair = mlxspec.load()
d = api.make_drafter(pair)
target = ModelState(pair.target)
hist = [1000 + (i * 37) % 5000 for i in range(64)]
target.prefill(hist); d.state.prefill(hist)
ids = [200 + i for i in range(40)]
def tfwd(w):
    p = target.sync(hist); mx.eval(mx.argmax(target.forward(p + ids[:w - len(p)]), axis=-1))
def dfwd(w):
    p = d.state.sync(hist); mx.eval(mx.argmax(d.state.forward(p + ids[:w - len(p)]), axis=-1))
def timed(f, *a):
    t = time.perf_counter(); f(*a); return time.perf_counter() - t
res = {}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
    for w in (1, 2, 3):
        for prev in ("target", "draft", "draft-x2"):
            if prev == "target": tfwd(1)
            elif prev == "draft": dfwd(1)
            else: dfwd(1); dfwd(1)
            t = timed(tfwd, w)
            if rep: res.setdefault((w, prev), []).append(t)
base = statistics.median(res[(1, "target")])
for k, v in sorted(res.items()):
    print(f"target x{k[0]} after {k[1]:9s} {statistics.median(v)*1e3:7.1f} ms  {statistics.median(v)/base:.2f} plain (n={len(v)})")
