import sys, time, statistics, os
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api
from mlxspec.cache import ModelState
pair = mlxspec.load()
tg = ModelState(pair.target)
d = api.make_drafter(pair); dr = d.state
hist = [1000 + (i*37) % 5000 for i in range(350)]
tg.prefill(hist); dr.prefill(hist)
def t_one(st, W):
    st.sync(hist); t0 = time.perf_counter()
    mx.eval(st.forward([hist[-1]] + [100 + j for j in range(W - 1)]))
    return time.perf_counter() - t0
WS = [1, 2, 3, 4, 5, 6, 8, 10]
res = {w: [] for w in WS}; dres = []
for w in WS: t_one(tg, w)
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
    for w in (WS if r % 2 == 0 else WS[::-1]):
        res[w].append(t_one(tg, w))
        dres.append(t_one(dr, 1)); dres.append(t_one(dr, 1))
p = statistics.median(res[1])
print("plain %.1f ms" % (p * 1e3), " ".join(f"{w}:{statistics.median(res[w])/p:.2f}" for w in WS), "draft %.3f" % (statistics.median(dres)/p))
