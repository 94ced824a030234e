"""Target forward over w positions (context 64), right after another target forward vs right after three
one-position draft forwards, 11 repeats interleaved: is a verify pass dearer after the draft ran?  Run from the
repository root: python benchmarks/records/2026-12-05-cut-pricing/calibrations/switch.py"""
import time, statistics
import mlxspec
import mlx.core as mx
from mlxspec.cache import ModelState
from mlxspec import api
pair = mlxspec.load()
dec = api.make_decoder(pair, "model", "auto", 0.0, tree=None)
draft_model = dec.drafter.state.model
context = 64
ids = [(7919 * i + 13) % 150000 + 1 for i in range(context + 40)]
history = ids[:context]
tgt, drf = ModelState(pair.target), ModelState(draft_model)
tgt.prefill(history); drf.prefill(history)
def fwd(st, w):
    pending = st.sync(history)
    t0 = time.perf_counter()
    logits = st.forward(pending + ids[context: context + w - len(pending)])
    mx.eval(mx.argmax(logits, axis=-1))
    return time.perf_counter() - t0
res = {}
for rep in range(12):
    for w in (1, 3, 5, 8):
        fwd(tgt, 1)
        a = fwd(tgt, w)            # after a target forward
        for _ in range(3): fwd(drf, 1)
        b = fwd(tgt, w)            # after draft forwards
        if rep:
            res.setdefault((w, 'after target'), []).append(a)
            res.setdefault((w, 'after draft'), []).append(b)
for k, v in sorted(res.items()):
    print(k, f"{statistics.median(v)*1000:.1f} ms (min {min(v)*1000:.1f})")
