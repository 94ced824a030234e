"""Where a forward's wall time goes by thread: graph building against evaluation, and each OS thread's CPU time
over the wall time of 12 forwards (draft and target, 1 and 6 positions, after a 100-token context)."""
import sys, time, statistics, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api
from mlxspec.cache import ModelState
pair = mlxspec.load()
d = api.make_drafter(pair)
target = ModelState(pair.target)
hist = [1000 + (i * 37) % 5000 for i in range(100)]
target.prefill(hist); d.state.prefill(hist)
ids = [200 + i for i in range(40)]
def threads_cpu():
    out = {}
    for t in os.listdir("/proc/self/task"):
        f = open(f"/proc/self/task/{t}/stat").read().split(")")[-1].split()
        out[t] = (int(f[11]) + int(f[12]))  # utime+stime ticks
    return out
for name, st in (("draft", d.state), ("target", target)):
    for w in (1, 6):
        b, e, tot = [], [], []
        c0 = threads_cpu()
        for r in range(12):
            t0 = time.perf_counter()
            p = st.sync(hist); out = mx.argmax(st.forward(p + ids[:w - len(p)]), axis=-1)
            t1 = time.perf_counter(); mx.eval(out); t2 = time.perf_counter()
            b.append(t1 - t0); e.append(t2 - t1)
        c1 = threads_cpu()
        wall = sum(b) + sum(e)
        per = sorted(((c1[t] - c0.get(t, 0)) / 100 / wall, t + "/" + open(f"/proc/self/task/{t}/comm").read().strip()) for t in c1)[::-1][:4]
        print(f"{name} x{w}: build {statistics.median(b)*1e3:.1f} ms, eval {statistics.median(e)*1e3:.1f} ms; thread CPU/wall: " +
              ", ".join(f"{t}:{x:.2f}" for x, t in per), f"main={os.getpid()}", flush=True)
