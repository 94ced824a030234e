"""Per prompt, each contender's median decode rate over plain and over mlx-lm k=3, and the medians of those
(what `mlxspec bench` reports), for bench result folders.

    python benchmarks/records/2026-12-06-thread-pool/per_prompt.py FOLDER [FOLDER ...]
"""
import collections
import json
import statistics as st
import sys

for folder in sys.argv[1:]:
    d = json.load(open(f"{folder}/results.json"))
    agg = collections.defaultdict(list)
    for r in d["runs"]:
        agg[(r["contender"], r["prompt"])].append(float(r["decode_tps"]))
    prompts = sorted({p for _, p in agg})
    contenders = sorted({c for c, _ in agg})
    med = {k: st.median(v) for k, v in agg.items()}
    base = next(c for c in contenders if c.startswith("mlx-lm"))
    print(folder)
    for c in contenders:
        cells = " ".join(f"{p.split('/')[1][:6]} {med[(c, p)] / med[('plain', p)]:.2f}/"
                         f"{med[(c, p)] / med[(base, p)]:.2f}" for p in prompts)
        over_plain = st.median(med[(c, p)] / med[("plain", p)] for p in prompts)
        over_base = st.median(med[(c, p)] / med[(base, p)] for p in prompts)
        print(f"  {c:28s} {cells}  med {over_plain:.3f} / {over_base:.3f}")
