"""The draft's steps while the target's pass runs, in one process (stop 44).

    VIA=stream python overlap.py   # the pass on a second MLX stream, mx.async_eval, then the draft steps
    VIA=thread python overlap.py   # the pass evaluated by a Python thread with its own stream

300 cached tokens; a W-position target pass (W=5) and ND one-position draft steps (ND=4); medians of R
repeats (8 with a stream, 6 with a thread): the two in turn (seq), overlapped (conc), the pass alone
(tonly), the draft steps alone.  With a stream, four instrumented overlapped runs follow; with a thread,
each overlapped run's draft time and wait.
"""
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec  # noqa: E402
import mlx.core as mx  # noqa: E402
from mlxspec import api  # noqa: E402
from mlxspec.cache import ModelState  # noqa: E402

VIA = os.environ.get("VIA", "stream")
pair = mlxspec.load()
st = api.make_drafter(pair).state
tgt = ModelState(pair.target)
hist = [1000 + (i * 37) % 5000 for i in range(300)]
st.prefill(hist), tgt.prefill(hist)
W, ND = int(os.environ.get("W", "5")), int(os.environ.get("ND", "4"))
s2 = mx.new_stream(mx.cpu)


def target_graph():
    pending = tgt.sync(hist)
    return tgt.forward(pending + [100 + j for j in range(W - len(pending))])


def draft_steps():
    toks = st.sync(hist)
    for j in range(ND):
        mx.eval(st.forward(toks))
        toks = [200 + j]


def seq():
    mx.eval(target_graph())
    draft_steps()


def tonly():
    mx.eval(target_graph())


jobs, done, split = queue.Queue(), queue.Queue(), []


def worker():  # MLX 0.32 keeps streams per thread: this one makes its own
    s = mx.new_stream(mx.cpu)
    while True:
        f = jobs.get()
        with mx.stream(s):
            lg = f()
            mx.eval(lg)
        done.put(lg)


def conc():
    if VIA == "stream":
        with mx.stream(s2):
            lg = target_graph()
        mx.async_eval(lg)
        draft_steps()
        mx.eval(lg)
    else:
        jobs.put(target_graph)
        t0 = time.perf_counter()
        draft_steps()
        t1 = time.perf_counter()
        done.get()
        split.append((t1 - t0, time.perf_counter() - t1))


if VIA != "stream":
    threading.Thread(target=worker, daemon=True).start()
runs = (seq, conc, tonly, draft_steps)
for f in runs:
    f(), f()
split.clear()
res = {f.__name__: [] for f in runs}
for r in range(int(os.environ.get("R", "8" if VIA == "stream" else "6"))):
    for f in runs:
        t0 = time.perf_counter()
        f()
        res[f.__name__].append(time.perf_counter() - t0)
for k, v in res.items():
    print(f"{k:12s} median {statistics.median(v)*1e3:7.1f} ms  min {min(v)*1e3:7.1f}  max {max(v)*1e3:7.1f}")
if VIA == "stream":
    print("instrumented conc")
    for r in range(4):
        t0 = time.perf_counter()
        with mx.stream(s2):
            lg = target_graph()
        t1 = time.perf_counter()
        mx.async_eval(lg)
        t2 = time.perf_counter()
        draft_steps()
        t3 = time.perf_counter()
        mx.eval(lg)
        t4 = time.perf_counter()
        print(f"build {1e3*(t1-t0):.1f} async {1e3*(t2-t1):.1f} draft {1e3*(t3-t2):.1f} wait {1e3*(t4-t3):.1f}")
else:
    print("conc draft/wait", [(round(a * 1e3), round(b * 1e3)) for a, b in split])
