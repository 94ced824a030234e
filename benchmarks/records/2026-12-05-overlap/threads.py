import sys, time, statistics, os, threading
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api
from mlxspec.cache import ModelState
pair = mlxspec.load()
d = api.make_drafter(pair)
st = d.state
tgt = ModelState(pair.target)
hist = [1000 + (i*37) % 5000 for i in range(300)]
st.prefill(hist); tgt.prefill(hist)
W = int(os.environ.get("W", "5")); ND = int(os.environ.get("ND", "4"))
s2 = mx.new_stream(mx.cpu)
def target_graph():
    pending = tgt.sync(hist)
    return tgt.forward(pending + [100 + j for j in range(W - len(pending))])
def draft_steps():
    pending = st.sync(hist)
    toks = pending
    for j in range(ND):
        lg = st.forward(toks); mx.eval(lg); toks = [200 + j]
def seq():
    lg = target_graph(); mx.eval(lg); draft_steps()
import queue
jobs, done = queue.Queue(), queue.Queue()
def worker():
    s = mx.new_stream(mx.cpu)
    while True:
        f = jobs.get()
        with mx.stream(s):
            lg = f()
            mx.eval(lg)
        done.put(lg)
threading.Thread(target=worker, daemon=True).start()
class th:
    join = staticmethod(lambda: done.get())
def conc():
    jobs.put(target_graph)
    t0 = time.perf_counter()
    draft_steps()
    t1 = time.perf_counter()
    th.join()
    conc.split.append((t1 - t0, time.perf_counter() - t1))
conc.split = []
def tonly():
    lg = target_graph()
    mx.eval(lg)
for f in (seq, conc, tonly, draft_steps): f(); f()
res = {f.__name__: [] for f in (seq, conc, tonly, draft_steps)}
conc.split = []
for r in range(int(os.environ.get("R", "6"))):
    for f in (seq, conc, tonly, draft_steps):
        t0 = time.perf_counter(); f(); res[f.__name__].append(time.perf_counter() - t0)
for k, v in res.items():
    print(f"{k:12s} median {statistics.median(v)*1e3:7.1f} ms  min {min(v)*1e3:7.1f}  max {max(v)*1e3:7.1f}")
print("conc draft/wait", [(round(a*1e3), round(b*1e3)) for a, b in conc.split])
