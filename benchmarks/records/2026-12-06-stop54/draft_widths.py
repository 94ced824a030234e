"""A draft forward over 1..w positions, timed through ModelState.forward (compiled, as the calibration
times it) after 64 tokens, widths interleaved: python draft_widths.py 1,2,3,4 15"""
import sys, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import mlxspec
import mlx.core as mx
from mlxspec.loading import load
from mlxspec.api import make_decoder
from mlxspec import cost_model
pair = load(None, None)
dec = make_decoder(pair, "model", "auto")
st = cost_model._draft_state(dec.drafter)
print("compiled:", getattr(st, "compiled", None))
ids = [(7919 * i + 13) % 150000 + 1 for i in range(80)]
hist = ids[:64]
st.prefill(hist)
def fwd(w):
    pending = st.sync(hist)
    t0 = time.perf_counter()
    logits = st.forward(pending + ids[64:64 + w - len(pending)])
    mx.eval(mx.argmax(logits, axis=-1))
    return time.perf_counter() - t0
W = [int(x) for x in sys.argv[1].split(",")]
for w in W: fwd(w); fwd(w)
T = {w: [] for w in W}
for r in range(int(sys.argv[2])):
    for w in W:
        T[w].append(fwd(w))
m1 = statistics.median(T[W[0]])
for w in W:
    m = statistics.median(T[w])
    print(f"width {w}: median {m*1e3:.1f} ms  ({min(T[w])*1e3:.1f}-{max(T[w])*1e3:.1f})  x{m/m1:.2f}")
