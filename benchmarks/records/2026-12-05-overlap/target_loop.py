import sys, time, statistics, os
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec.cache import ModelState
pair = mlxspec.load(); tgt = ModelState(pair.target)
hist = [1000 + (i*37) % 5000 for i in range(300)]; tgt.prefill(hist)
import tempfile; Path(tempfile.gettempdir(), "target_loop.ready").write_text("1")  # threads/streams runs wait for it
ts = []
t_end = time.time() + float(sys.argv[1])
while time.time() < t_end:
    t0 = time.perf_counter(); pending = tgt.sync(hist); mx.eval(tgt.forward(pending + [100, 101, 102, 103, 104][:5 - len(pending)])); ts.append(time.perf_counter() - t0)
print(f"target W5 median {statistics.median(ts)*1e3:.1f} ms n={len(ts)}")
