"""Forwards with the pool's spinning workers yielding (as the patch sets them) or not, interleaved in one process.

    python benchmarks/records/2026-12-06-stop55/forward_ab.py 8      # repeats (the first is a warm-up)

The default pair, a 100-token context: the draft's compiled forward over 1 and 3 positions, the
target's over 1, 6 and 12, and a round-like sequence (4 one-position draft forwards, then a target
pass over 9 positions); each variant in turn (rotating order per repeat), every call made once
untimed before its timed call.  Reported: medians, and the yielding variant over the other run by
run (median, range; above 1 the yielding one is faster).
Runs only with spin-yield-not-kept.patch applied (git apply), which adds mlxspec_pool_yield;
the change was not kept (see the records README).
"""
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec  # noqa: E402
import mlx.core as mx  # noqa: E402
from mlxspec import api, small_gemm  # noqa: E402
from mlxspec.cache import ModelState  # noqa: E402

lib = small_gemm._state["lib"]
lib.mlxspec_pool_yield.argtypes = [ctypes.c_int]
shipped = lib.mlxspec_pool_yield(0)
lib.mlxspec_pool_yield(shipped)
pair = mlxspec.load()
d = api.make_drafter(pair)
target = ModelState(pair.target)
hist = [1000 + (i * 37) % 5000 for i in range(100)]
target.prefill(hist)
d.state.prefill(hist)
ids = [200 + i for i in range(40)]


def fwd(st, w):
    p = st.sync(hist)
    mx.eval(mx.argmax(st.forward(p + ids[:w - len(p)]), axis=-1))


def round_like():
    for _ in range(4):
        fwd(d.state, 1)
    fwd(target, 9)


variants = {f"yield every {shipped}": shipped, "no yield": 0}
tests = {"draft x1": lambda: fwd(d.state, 1), "draft x3": lambda: fwd(d.state, 3), "target x1": lambda: fwd(target, 1),
         "target x6": lambda: fwd(target, 6), "target x12": lambda: fwd(target, 12), "round 4 drafts + x9": round_like}
res = {}
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 8
for rep in range(repeats):
    names = list(variants)[rep % 2:] + list(variants)[:rep % 2]
    for v in names:
        lib.mlxspec_pool_yield(variants[v])
        for t, f in tests.items():
            f()
            t0 = time.perf_counter()
            f()
            if rep:
                res.setdefault((t, v), []).append(time.perf_counter() - t0)
lib.mlxspec_pool_yield(shipped)
first, other = list(variants)
for t in tests:
    ratios = sorted(b / a for a, b in zip(res[(t, first)], res[(t, other)]))
    print(f"{t:20s} {first} {statistics.median(res[(t, first)]) * 1e3:6.1f} ms, {other} "
          f"{statistics.median(res[(t, other)]) * 1e3:6.1f} ms: {statistics.median(ratios):.2f}x "
          f"({ratios[0]:.2f}-{ratios[-1]:.2f}, n={len(ratios)})", flush=True)
