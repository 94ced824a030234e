import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import mlxspec
import mlx.core as mx
from mlxspec.loading import load
from mlxspec.api import make_decoder
from mlxspec import cost_model
pair = load(None, None)
dec = make_decoder(pair, "model", "auto")
st = cost_model._draft_state(dec.drafter)
ids = [(7919 * i + 13) % 150000 + 1 for i in range(80)]
hist = ids[:64]
st.prefill(hist)
w = int(sys.argv[1])
def fwd():
    pending = st.sync(hist)
    logits = st.forward(pending + ids[64:64 + w - len(pending)])
    mx.eval(mx.argmax(logits, axis=-1))
for _ in range(3): fwd()
print("GO", flush=True)
t0 = time.perf_counter()
n = int(sys.argv[2])
for _ in range(n): fwd()
print(f"width {w}: {(time.perf_counter()-t0)/n*1e3:.1f} ms", flush=True)
