import sys, time, os, statistics, random
sys.path.insert(0, "/work/main")
import mlxspec
import mlx.core as mx
from mlxspec import cache
which = sys.argv[1]; widths = [int(x) for x in sys.argv[2].split(",")]; reps = int(sys.argv[3])
pair = mlxspec.load()
model = pair.draft if which == "draft" else pair.target
history = list(range(1000, 1200))
state = cache.ModelState(model)
state.prefill(history)
def chain(n):
    state.sync(history)
    t0 = time.perf_counter()
    mx.eval(state.forward(history[-1:] + [history[-2]] * (n - 1)))
    return time.perf_counter() - t0
for n in widths: chain(n)
times = {n: [] for n in widths}
for r in range(reps):
    order = widths[:] ; random.Random(r).shuffle(order)
    for n in order:
        times[n].append(chain(n))
base = statistics.median(times[widths[0]])
for n in widths:
    m = statistics.median(times[n])
    print(f"{which} x{n:02d} {1000*m:7.1f} ms {m/base:5.2f} (min {1000*min(times[n]):.1f})")
