"""The kernels' parallel loops run on one process-wide pool of threads (thread_pool.c),
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

from mlxspec import small_gemm

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
    """A loop that arrives while another runs takes its caller alone; both are right."""
    a, w = operands(1)
    ref = np.array(a @ w)
    results, errors = {}, []

    def run(name):
        try:
            with mx.stream(mx.new_stream(mx.cpu)):
                for i in range(20):
                    out = a @ w
                    mx.eval(out)
                    results[(name, i)] = np.array(out)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    workers = [threading.Thread(target=run, args=(n,)) for n in "ab"]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not errors and len(results) == 40
    assert all(np.array_equal(r, ref) for r in results.values())
