"""Timing ablation of a compiled draft step: each component replaced by an identity (wrong logits, timing only)."""
import sys, time, statistics, os
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx
from mlxspec import api, lean_ops, lean_attention, blas_layout, kernel_ops
import mlx_lm.models.qwen2 as q2
pair = mlxspec.load()
d = api.make_drafter(pair)
st = d.state
hist = [1000 + (i*37) % 5000 for i in range(300)]
st.prefill(hist)
W = int(os.environ.get("W", "1"))
orig = {"attn": q2.scaled_dot_product_attention, "rope": lean_ops.LeanRope.__call__, "norm": lean_ops.LeanRMSNorm.__call__,
        "swiglu": kernel_ops.swiglu}
def setmode(m):
    q2.scaled_dot_product_attention = (lambda q, k, v, cache=None, scale=None, mask=None, sinks=None: q) if m == "attn" else orig["attn"]
    lean_ops.LeanRope.__call__ = (lambda self, x, offset=0: x) if m == "rope" else orig["rope"]
    lean_ops.LeanRMSNorm.__call__ = (lambda self, x: x) if m == "norm" else orig["norm"]
    blas_layout.module_changes = 2000 + MODES.index(m)
MODES = ["full", "attn", "rope", "norm"]
def one():
    st.sync(hist); lg = st.forward([hist[-1]] + [100 + j for j in range(W - 1)]); mx.eval(lg)
res = {m: [] for m in MODES}
for m in MODES:
    setmode(m); [one() for _ in range(3)]
for i in range(int(os.environ.get("N", "25"))):
    for m in (MODES if i % 2 == 0 else MODES[::-1]):
        setmode(m); one()
        t0 = time.perf_counter(); one(); one(); res[m].append((time.perf_counter() - t0) / 2)
full = statistics.median(res["full"])
for m in MODES: print(f"{m:6s} {statistics.median(res[m])*1e3:6.2f} ms  (saves {1e3*(full - statistics.median(res[m])):.2f})")
