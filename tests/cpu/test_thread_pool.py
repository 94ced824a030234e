"""The kernels' parallel loops run on one process-wide pool of threads (cpu/thread_pool.c),
whichever thread calls them.  MLX runs each stream's work on a thread of its own; with
OpenMP a second stream (mlx-lm's generate makes one) started a second team of threads,
and libgomp, managing more threads than CPUs, then let every idle worker spin only 100
iterations: each later product woke its workers from sleep, a plain step 4-5 % slower and
a speculative generation 6-9 % for the rest of the process."""

import os
import threading

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.cpu import kernel as small_gemm

pytestmark = [pytest.mark.skipif(not small_gemm.loaded(), reason=f"kernel not loaded: {small_gemm.why()}"),
              pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: the kernels run on their caller")]


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def operands(seed=0):
    rng = np.random.default_rng(seed)
    # 8 x 1024 x 4096 multiply-adds: well over the kernel's parallel threshold
    return mx.array(rng.standard_normal((8, 1024)).astype(np.float32)), \
        mx.array(rng.standard_normal((1024, 4096)).astype(np.float32))


def test_a_second_stream_runs_its_products_on_the_same_pool():
    a, w = operands()
    calls = small_gemm.calls()
    ref = a @ w
    mx.eval(ref)  # on the default stream's thread: the pool is started
    assert small_gemm.calls() == calls + 1
    threads, loops = small_gemm.pool()
    assert threads == min(os.cpu_count(), int(os.environ.get("OMP_NUM_THREADS") or 64)) and loops > 0
    stream = mx.new_stream(mx.cpu)
    with mx.stream(stream):
        mx.eval(mx.zeros(4) + 1)  # the stream's own thread now exists
    before = os_threads()
    with mx.stream(stream):
        out = a @ w
        mx.eval(out)
    assert small_gemm.pool()[1] > loops, "the product on the other stream did not run on the pool"
    assert os_threads() == before, "a product on another stream's thread started threads of its own"
    assert np.array_equal(np.array(out), np.array(ref))  # the same sums, whichever thread split them


def test_products_from_two_threads_at_once_are_right():
    """A loop that arrives while another runs takes its caller alone; both are right.  The
    kernel is called directly (ctypes releases the GIL): MLX serialises its streams' work."""
    import ctypes

    f = small_gemm._state["lib"].cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    rng = np.random.default_rng(1)
    a = [rng.standard_normal((8, 1024)).astype(np.float32) for _ in range(2)]
    w = rng.standard_normal((1024, 4096)).astype(np.float32)

    def product(x):
        out = np.zeros((8, 4096), np.float32)
        f(101, 111, 111, 8, 4096, 1024, 1.0, x.ctypes.data, 1024, w.ctypes.data, 4096, 0.0, out.ctypes.data, 4096)
        return out

    refs = [product(x) for x in a]
    results, errors = {}, []

    def run(t):
        try:
            for i in range(200):
                results[(t, i)] = product(a[t])
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not errors and len(results) == 400
    assert all(np.array_equal(r, refs[t]) for (t, _), r in results.items())
