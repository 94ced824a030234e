"""The operations a compiled draft step replays, by type: the default draft's forward over one
position as compiled_forward.py traces it (its _Slot caches, the RoPE tables given), exported
before mx.compile fuses element-wise runs (MLX's export_to_dot), counted by primitive.  With
--compiled: the operations the compiled call itself dispatches, after the fusion (its outputs
exported).

    PYTHONPATH=TREE python ops_count.py [--compiled]
"""
import collections
import re
import sys
import tempfile

import mlxspec
import mlx.core as mx
import numpy as np
from mlxspec import api
from mlxspec import compiled_forward as cf

pair = mlxspec.load()
state = api.make_drafter(pair).state
hist = [1000 + (i * 37) % 5000 for i in range(300)]
state.prefill(hist)
state.sync(hist)
mx.eval(state.forward([hist[-1]]))  # the caches at their compiled capacity
mx.eval([a for c in state.cache for a in (c.keys, c.values)])
tables, d = cf._rope_tables(state.model), cf._head_dim(state.model)
cap, o = state.cache[0].keys.shape[2], state.cache[0].offset
mask = np.zeros((1, cap), bool)
mask[:, :o + 1] = True
cos, sin = tables.tables(("at", np.array([o]).tobytes()), np.array([o]), d)
if "--compiled" in sys.argv:
    state.sync(hist)
    outputs = [state.forward([hist[-1]])] + [a for c in state.cache for a in (c.keys, c.values)]
else:
    slots = [cf._Slot(c.keys, c.values, mx.array([o], dtype=mx.int32), mx.array(mask)) for c in state.cache]
    with tables.giving(cos, sin):
        logits = state.model(mx.array([[hist[-1]]], dtype=mx.uint32), cache=slots)
    outputs = [logits] + [a for s in slots for a in (s.keys, s.values)]
with tempfile.NamedTemporaryFile(suffix=".dot") as f:
    mx.export_to_dot(f.name, *outputs)
    counts = collections.Counter(re.findall(r'label ="([A-Za-z_0-9]+)', open(f.name).read()))
print(f"{sum(counts.values())} operations:", ", ".join(f"{k} {v}" for k, v in counts.most_common()))
