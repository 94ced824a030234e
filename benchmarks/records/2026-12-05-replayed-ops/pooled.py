"""The code benches of stop 46 pooled, before (bench-code-base*, main at ce146e2) and after the change
(bench-code1..3): the default over mlx-lm k=3 and over plain, pair by pair (the same prompt and repeat
of one run), with the median's bootstrap 90 % interval.

    python benchmarks/records/2026-12-05-replayed-ops/pooled.py
"""
import collections
import json
import random
import statistics as st
from pathlib import Path

HERE = Path(__file__).resolve().parent
for name, pattern in (("before", "bench-code-base[0-9]"), ("after", "bench-code[0-9]")):
    over_mlx_lm, over_plain = [], []
    for run in sorted(p for p in HERE.glob(pattern) if p.is_dir()):
        pairs = collections.defaultdict(dict)
        for r in json.loads((run / "results.json").read_text())["runs"]:
            pairs[(r["prompt"], r["repeat"])][r["contender"]] = r["decode_tps"]
        for v in pairs.values():
            over_mlx_lm.append(v["mlxspec model auto"] / v["mlx-lm k=3"])
            over_plain.append(v["mlxspec model auto"] / v["plain"])
    random.seed(0)
    boot = sorted(st.median(random.choices(over_mlx_lm, k=len(over_mlx_lm))) for _ in range(5000))
    print(f"{name}: pairs {len(over_mlx_lm)}; over mlx-lm k=3: median {st.median(over_mlx_lm):.3f}, quartiles "
          f"{[round(q, 3) for q in st.quantiles(over_mlx_lm, n=4)]}, share >= 1.3 "
          f"{sum(x >= 1.3 for x in over_mlx_lm) / len(over_mlx_lm):.2f}, bootstrap 90 % interval of the median "
          f"{boot[250]:.3f}-{boot[4750]:.3f}; over plain: median {st.median(over_plain):.3f}")
