"""Attention's scores for the default draft's shape (2 key heads, 7 query heads each,
head size 64, 512 positions), 24 layers in one compiled function: against the keys
as the cache stores them (B, H, T, D), transposed in the product, and against a
contiguous transposed copy (B, H, D, T).  python scores.py L  (L positions)."""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec  # noqa: E402,F401
import mlx.core as mx  # noqa: E402

T, L = 512, int(sys.argv[1])
q = mx.random.normal((1, 2, 1, 7 * L, 64))
k = mx.random.normal((1, 2, 1, T, 64))
kt = mx.contiguous(mx.swapaxes(k, -1, -2))
mx.eval(q, k, kt)


def timed(fn, *args):
    c = mx.compile(fn)
    for _ in range(5):
        mx.eval(c(*args))
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        mx.eval(c(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def layers(op):
    def f(x, keys):
        for _ in range(24):
            x = op(x, keys)[..., :64]  # the next layer's queries: same shape
        return x
    return f


print(f"L={L}: keys as stored {timed(layers(lambda x, k: x @ mx.swapaxes(k, -1, -2)), q, k):.2f} ms, "
      f"transposed copy {timed(layers(lambda x, kt: x @ kt), q, kt):.2f} ms")
