"""A loaded pair serves several threads at once (issue 56, class 4): every thread's
greedy output equals the single-threaded one, for chains and trees, through
`mlxspec.generate` and through Sessions; a tree call patches no shared model object
(its positions and mask travel with the call); a decoder busy in one thread is refused
to another in one line; and a process whose threads generated exits cleanly."""

import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxspec
import tiny_models
from mlxspec.core.cache import ModelState
from mlxspec.errors import MlxspecError
from mlxspec.session.session import Session
from mlxspec.trees.attention import TreeBlock, _layers

PROMPTS = ("w1 w2 w3", "w7 w7 w7 w7 w9", "w40 w41", "w5 w6 w7 w8")
KINDS = ({"tree": None}, {"tree": False}, {"tree": None, "drafter": "hybrid"})
THREADS = 3


@pytest.fixture(autouse=True)
def often_switching():
    """Threads switched every 10 microseconds (not 5 ms): interleavings come often."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def _in_threads(work, n=THREADS):
    """Run work(i) in n threads started together; the exceptions they raised."""
    start, errors = threading.Barrier(n), []

    def run(i):
        try:
            start.wait()
            work(i)
        except Exception as e:  # noqa: BLE001 -- reported by the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_generate_what_one_thread_generates(tiny_pair):
    def gen(prompt, kind):
        return mlxspec.generate(tiny_pair, prompt, max_tokens=12, **kind).tokens

    jobs = [(p, i) for p in PROMPTS for i in range(len(KINDS))]
    expected = {(p, i): gen(p, KINDS[i]) for p, i in jobs}
    got = {}

    def work(t):
        for j in range(len(jobs)):
            p, i = jobs[(j + 5 * t) % len(jobs)]
            got[t, p, i] = gen(p, KINDS[i])

    assert _in_threads(work) == []
    assert len(got) == THREADS * len(jobs)
    for (t, p, i), tokens in got.items():
        assert tokens == expected[p, i], (t, p, KINDS[i])


def test_two_sessions_on_one_pair_in_two_threads(tiny_pair):
    def chat(tree):
        s = Session(pair=tiny_pair, max_tokens=10, tree=tree)
        return [s.send(m).tokens for m in ("w1 w2 w3", "w9 w8")]

    trees = (None, False)
    expected = {t: chat(t) for t in trees}
    got = {}

    def work(i):
        for _ in range(2):
            got.setdefault(i, []).append(chat(trees[i]))

    assert _in_threads(work, 2) == []
    for i, replies in got.items():
        assert replies == [expected[trees[i]]] * 2


def test_a_tree_call_patches_no_shared_model_object():
    """During a tree block's forward (a branching one, not a chain) every attention
    layer's RoPE is the object it was before the call -- seen mid-call, from inside
    the model -- and no cache but the call's own gets a mask."""
    model = tiny_models.make_model("qwen2", vocab_size=64)
    state = ModelState(model)
    state.prefill([3, 4, 5, 6])
    state.sync([3, 4, 5, 6])
    TreeBlock(state).forward([7, 8, 9], [-1, -1, 0])  # puts the layers' wrappers in place, once
    state.sync([3, 4, 5, 6])
    attns = [layer.self_attn for layer in _layers(model)]
    ropes = [a.rope for a in attns]
    seen = []
    probe = state.cache[1]
    fetch = probe.update_and_fetch

    def spying(keys, values):
        seen.append([a.rope for a in attns])
        return fetch(keys, values)

    probe.update_and_fetch = spying
    other = ModelState(model)  # another call's state on the same model
    TreeBlock(state).forward([7, 8, 9], [-1, -1, 0])
    assert seen and all(all(r is o for r, o in zip(now, ropes)) for now in seen)
    assert [a.rope for a in attns] == ropes
    assert "make_mask" not in state.cache[0].__dict__ and "make_mask" not in other.cache[0].__dict__


def test_a_tree_call_in_one_thread_leaves_another_threads_forward_alone():
    """A chain forward in another thread while tree calls run gives the plain logits."""
    model = tiny_models.make_model("llama", vocab_size=64)
    prompt = [3, 4, 5, 6, 7, 8]
    want = np.array(model(mx.array(prompt, dtype=mx.uint32)[None])[0])
    stop, got = threading.Event(), []

    def trees():
        while not stop.is_set():
            s = ModelState(model)
            s.prefill([3, 4, 5])
            s.sync([3, 4, 5])
            mx.eval(TreeBlock(s).forward([9, 10, 11, 12], [-1, -1, 0, 1]))

    t = threading.Thread(target=trees)
    t.start()
    try:
        for _ in range(40):
            got.append(np.array(model(mx.array(prompt, dtype=mx.uint32)[None])[0]))
    finally:
        stop.set()
        t.join()
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


@pytest.mark.linux_cpu  # the CPU accelerator's RoPE tables (cpu/layers.py)
def test_rope_tables_given_in_one_thread_only():
    from mlxspec.cpu.layers import RopeTables

    tables = RopeTables(16, 10000.0, 1.0, False)
    seen = []
    with tables.giving(mx.ones((1, 16)), mx.zeros((1, 16))):
        t = threading.Thread(target=lambda: seen.append(tables.given))
        t.start()
        t.join()
        assert tables.given is not None
    assert seen == [None]


def test_a_decoder_busy_in_another_thread_is_refused_in_one_line(tiny_pair):
    decoder = mlxspec.make_decoder(tiny_pair, tree=False)
    holding, done = threading.Event(), threading.Event()

    def hold():
        stream = decoder.generate([5, 6, 7], max_tokens=50)
        next(stream)
        holding.set()
        done.wait(30)
        stream.close()

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(30)
        with pytest.raises(MlxspecError) as e:
            next(decoder.generate([5, 6, 7], max_tokens=4))
        assert "another thread" in str(e.value) and "\n" not in str(e.value)
    finally:
        done.set()
        t.join()
    assert len(list(decoder.generate([5, 6, 7], max_tokens=4))) == 4  # free again once that one closed


SCRIPT = r"""
import sys, threading
sys.path.insert(0, {tests!r})
import mlxspec, tiny_models
import mlx.core as mx
from mlxspec.drafting.drafters import ModelDrafter
from mlxspec.costs.draft_length import FixedK
from mlxspec.decoder import SpeculativeDecoder
target = tiny_models.make_model("qwen2", vocab_size=64)
mx.eval(mx.random.normal((3,)))  # MLX's random state used in the main thread, as loading a model does
def work():
    dec = SpeculativeDecoder(target, ModelDrafter(target), FixedK(2))
    print(len(list(dec.generate([3, 4, 5], max_tokens=6))))
t = threading.Thread(target=work)
t.start()
t.join()
"""


def test_a_process_whose_thread_generated_exits_cleanly():
    """MLX (0.32) aborts at exit ("terminate called without an active exception")
    when a thread that used it did not clear its streams: generate clears them when
    its thread ends."""
    code = SCRIPT.format(tests=str(Path(__file__).parent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["6"]
