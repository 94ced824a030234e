import sys, time, statistics, os
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api, lean_ops, blas_layout
pair = mlxspec.load()
d = api.make_drafter(pair)
st = d.state
hist = [1000 + (i*37) % 5000 for i in range(int(os.environ.get("CTX","300")))]
st.prefill(hist)
orig_call = lean_ops.LeanRope.__call__
SIGN = mx.array([-1.0, 1.0], dtype=mx.float32).reshape(2, 1)
def new_call(self, x, offset=0):
    t = self._tables
    if t.given is not None and not self.traditional and self.dims == x.shape[-1]:
        c, s = t.given
        h = self.dims // 2
        xs = x.reshape(*x.shape[:-1], 2, h)
        L = c.shape[0]
        out = xs * c.reshape(L, 2, h) + xs[..., ::-1, :] * (s.reshape(L, 2, h) * SIGN)
        return out.reshape(x.shape)
    return orig_call(self, x, offset)
def setmode(m):
    lean_ops.LeanRope.__call__ = orig_call if m == "concat" else new_call
    blas_layout.module_changes = 1000 + (m == "reversed")
W = int(os.environ.get("W", "1"))
def one():
    st.sync(hist)
    lg = st.forward([hist[-1]] + [100 + j for j in range(W - 1)])
    mx.eval(lg); return lg
res = {"concat": [], "reversed": []}; outs = {}
for m in res:
    setmode(m); [one() for _ in range(3)]; outs[m] = one()
print("bit-identical logits:", mx.array_equal(outs["concat"], outs["reversed"]).item())
for i in range(int(os.environ.get("N", "40"))):
    for m in (res if i % 2 == 0 else list(res)[::-1]):
        setmode(m); one()
        t0 = time.perf_counter(); one(); one(); res[m].append((time.perf_counter() - t0) / 2)
for m in res: print(m, f"{statistics.median(res[m])*1e3:.2f} ms")
r = [a / b for a, b in zip(res["concat"], res["reversed"])]
print("concat/reversed paired median", round(statistics.median(r), 3), "quartiles", [round(x, 3) for x in statistics.quantiles(r, n=4)])
