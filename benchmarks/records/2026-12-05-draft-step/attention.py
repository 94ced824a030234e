"""24 layers' attention of the default draft (one position, 512 cached positions): lean_attention as
shipped, and its two products alone; compiled, median of 40.  Run once per build of small_gemm.c."""
import sys, time, statistics
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import lean_attention
cap, L = 512, 1
B, nq, nkv, D = 1, 14, 2, 64
qs = [mx.random.normal((B, nq, L, D)) for _ in range(24)]
ks = [mx.random.normal((B, nkv, cap, D)) for _ in range(24)]
vs = [mx.random.normal((B, nkv, cap, D)) for _ in range(24)]
mask = mx.array([[True] * 300 + [False] * (cap - 300)])
mx.eval(qs, ks, vs, mask)
def variant(name):
    def f(mask, *a):
        outs = []
        for i in range(24):
            q, k, v = a[i], a[24 + i], a[48 + i]
            if name == "lean":
                outs.append(lean_attention.lean_attention(q, k, v, None, 0.125, mask))
            elif name == "matmuls-only":
                qq = (q * 0.125).reshape(B, nkv, 7, D)
                s = qq @ mx.swapaxes(k, -1, -2)
                outs.append((s @ v).reshape(B, nq, L, D))
        return outs
    return mx.compile(f)
for name in ("lean", "matmuls-only"):
    f = variant(name); mx.eval(f(mask, *qs, *ks, *vs)); mx.eval(f(mask, *qs, *ks, *vs))
    ts = []
    for _ in range(40):
        t0 = time.perf_counter(); mx.eval(f(mask, *qs, *ks, *vs)); ts.append(time.perf_counter() - t0)
    print(f"{name:14s} {statistics.median(ts)*1e3:.2f} ms for 24 layers")
