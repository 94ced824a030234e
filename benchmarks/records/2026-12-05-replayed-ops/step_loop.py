"""The loop this folder's scripts time: the default pair loaded from the mlxspec that PYTHONPATH gives,
its draft prefilled with 300 tokens, and the draft's compiled forward over `width` positions at the same
place again and again (warm: 5 untimed first), for `seconds`."""
import time

import mlxspec
import mlx.core as mx
from mlxspec import api


def timed(seconds: float, width: int = 1, ready=None) -> list[float]:
    """The steps' times in seconds; `ready()` is called once the loop is warm."""
    state = api.make_drafter(mlxspec.load()).state
    hist = [1000 + (i * 37) % 5000 for i in range(300)]
    state.prefill(hist)

    def one():
        state.sync(hist)
        mx.eval(state.forward([hist[-1]] + [100 + j for j in range(width - 1)]))

    for _ in range(5):
        one()
    if ready is not None:
        ready()
    times, end = [], time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    return times
