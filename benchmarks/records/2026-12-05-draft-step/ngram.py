import sys, json, glob, time, collections
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import mlxspec
from mlxspec import vocab_subset
from mlxspec.api import encode_prompt
pair = mlxspec.load()
tok = pair.tokenizer
t0 = time.time()
files = vocab_subset.corpus_files()
fast = getattr(tok, "_tokenizer", None) or tok
texts = [f.read_text(errors="ignore") for f in files]
encs = fast.encode_batch(texts, add_special_tokens=False) if hasattr(fast, "encode_batch") else [tok.encode(t) for t in texts]
seqs = [e.ids if hasattr(e, "ids") else e for e in encs]
print("corpus tokens", sum(map(len, seqs)), time.time() - t0)
tri = collections.defaultdict(collections.Counter); bi = collections.defaultdict(collections.Counter)
for s in seqs:
    for i in range(2, len(s)):
        tri[(s[i-2], s[i-1])][s[i]] += 1
        bi[s[i-1]][s[i]] += 1
tri1 = {k: c.most_common(1)[0] for k, c in tri.items()}
bi1 = {k: c.most_common(1)[0] for k, c in bi.items()}
print("tables", len(tri1), len(bi1), time.time() - t0)
runs = {}
for f in glob.glob(str(Path(__file__).resolve().parents[1] / "2026-12-05-deferred-siblings") + "/bench-*/results.json"):
    d = json.load(open(f))
    for r in d["runs"]:
        if r["temp"] == 0.0 and r["contender"] == "plain":
            runs[(r["suite"], r["prompt"])] = r["tokens"]
for (suite, prompt), out in sorted(runs.items()):
    hit = {"tri": 0, "tri+bi": 0, "conv": 0, "any": 0}; n = 0
    for i in range(2, len(out)):
        n += 1
        a, b, nxt = out[i-2], out[i-1], out[i]
        g_tri = tri1.get((a, b), (None, 0))[0]
        g = g_tri if g_tri is not None else bi1.get(b, (None, 0))[0]
        # conversation bigram: last occurrence of b earlier in output
        g_conv = None
        for j in range(i - 2, 0, -1):
            if out[j - 1] == a and out[j] == b: g_conv = out[j + 1]; break
        hit["tri"] += g_tri == nxt; hit["tri+bi"] += g == nxt; hit["conv"] += g_conv == nxt
        hit["any"] += (g_conv if g_conv is not None else g) == nxt
    print(f"{suite:8s} {prompt:18s} n={n} " + " ".join(f"{k} {100*v/n:.0f}%" for k, v in hit.items()))
