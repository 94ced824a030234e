"""Minor page faults and time per target forward, in the loop (chains, creative prompt) vs alone."""
import sys, time, statistics, resource, collections
sys.path.insert(0, "/work/main")
import mlxspec, mlx.core as mx
from mlxspec import api, cache
pair = mlxspec.load()
stats = collections.defaultdict(list)
orig = cache.ModelState.forward
depth = [0]
def fwd(self, tokens, *a, **k):
    depth[0] += 1
    if depth[0] > 1:
        out = orig(self, tokens, *a, **k); depth[0] -= 1; return out
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t0 = time.perf_counter()
    out = orig(self, tokens, *a, **k); mx.eval(out)
    who = "target" if self.model is pair.target else "draft"
    depth[0] -= 1
    stats[(who, len(tokens), (a or [k.get("width")])[0])].append((time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0))
    return out
cache.ModelState.forward = fwd
prompt = "Write a short poem about autumn leaves."
for rep in range(2):
    stats.clear()
    text = api.generate(pair, prompt, max_tokens=48, tree=False)
for k, v in sorted(stats.items()):
    if len(v) >= 2:
        print(k, len(v), f"{statistics.median(x[0] for x in v)*1e3:.1f} ms", "faults", statistics.median(x[1] for x in v))
