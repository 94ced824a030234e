import sys, time, statistics, os
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api
pair = mlxspec.load()
d = api.make_drafter(pair)
st = d.state
hist = [1000 + (i*37) % 5000 for i in range(int(os.environ.get("CTX","300")))]
st.prefill(hist)
K = 4
def synced():
    st.sync(hist)
    base = st.fed
    tok = [hist[-1]]
    for i in range(K):
        lg = st.forward(tok)
        t = mx.argmax(lg[-1]).item()
        tok = [t]
def piped():
    st.sync(hist)
    x = mx.array([hist[-1]], dtype=mx.uint32)
    outs = []
    for i in range(K):
        lg = st._call(x)
        x = mx.argmax(lg[-1:], axis=-1).astype(mx.uint32)
        mx.async_eval(x)
        outs.append(x)
    mx.eval(outs)
    st.tokens.extend([hist[-1]] + [int(o.item()) for o in outs[:-1]])
def timeprep():
    # host time to build one step's graph (no eval)
    st.sync(hist)
    t0 = time.perf_counter()
    lg = st.forward([hist[-1]])
    t1 = time.perf_counter()
    mx.eval(lg)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1
for f in (synced, piped, synced, piped): f()
res = {"synced": [], "piped": []}
for i in range(40):
    for name, f in (("synced", synced), ("piped", piped)):
        t0 = time.perf_counter(); f(); res[name].append((time.perf_counter() - t0) / K)
for n in res: print(n, f"{statistics.median(res[n])*1e3:.2f} ms/step")
pr = [timeprep() for _ in range(30)]
print("build %.2f ms, eval %.2f ms" % (statistics.median(p[0] for p in pr)*1e3, statistics.median(p[1] for p in pr)*1e3))
