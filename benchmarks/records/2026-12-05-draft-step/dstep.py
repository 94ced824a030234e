import sys, time, statistics
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api
pair = mlxspec.load()
d = api.make_drafter(pair)
print(type(d).__name__, d.cost_key)
st = d.state
import os; hist = [1000 + (i*37) % 5000 for i in range(int(os.environ.get("CTX","300")))]
st.prefill(hist)
W = int(sys.argv[1]) if len(sys.argv) > 1 else 1
N = int(sys.argv[2]) if len(sys.argv) > 2 else 100
def one():
    pending = st.sync(hist)
    lg = st.forward(pending + [100 + j for j in range(W)])
    mx.eval(lg)
for _ in range(5): one()
ts = []
for _ in range(N):
    t0 = time.perf_counter(); one(); ts.append(time.perf_counter() - t0)
print(f"W={W} median {statistics.median(ts)*1e3:.2f} ms min {min(ts)*1e3:.2f}")
