import sys
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec, mlx.core as mx, numpy as np
from mlxspec import compiled_forward
from mlxspec.cache import ModelState
pair = mlxspec.load()
for compiled in (False, True):
    a, b = ModelState(pair.target), ModelState(pair.target)
    if compiled:
        compiled_forward.attach(a); compiled_forward.attach(b)
    hist = [1000 + (i*37) % 5000 for i in range(200)]
    a.prefill(hist); b.prefill(hist)
    new = [101, 202, 303, 404, 505]
    wide = np.array(a.forward(a.sync(hist) + new))
    rows = []
    h = list(hist)
    for t in new:
        pend = b.sync(h)
        rows.append(np.array(b.forward(pend + [t]))[-1]); h.append(t)
    rows = np.stack(rows)
    print("compiled" if compiled else "uncompiled", "bitwise equal per position:", [bool(np.array_equal(wide[len(wide)-5+i], rows[i])) for i in range(5)],
          "max diff", float(np.abs(wide[-5:] - rows).max()))
