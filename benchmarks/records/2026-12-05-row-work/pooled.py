"""The three code benches of stop 44 pooled: the default over mlx-lm k=3 and over plain, pair by pair
(the same prompt and repeat of one run), with the median's bootstrap 90 % interval.

    python benchmarks/records/2026-12-05-row-work/pooled.py
    python benchmarks/records/2026-12-05-row-work/pooled.py FOLDER   # the bench-code* runs of another folder
    python benchmarks/records/2026-12-05-row-work/pooled.py FOLDER 'bench-code-base[0-9]'   # its runs named so
"""
import collections
import json
import random
import statistics as st
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
RUNS = sorted(p.name for p in HERE.glob(sys.argv[2] if len(sys.argv) > 2 else "bench-code*") if p.is_dir())
over_mlx_lm, over_plain = [], []
for run in RUNS:
    pairs = collections.defaultdict(dict)
    for r in json.loads((HERE / run / "results.json").read_text())["runs"]:
        pairs[(r["prompt"], r["repeat"])][r["contender"]] = r["decode_tps"]
    for v in pairs.values():
        over_mlx_lm.append(v["mlxspec model auto"] / v["mlx-lm k=3"])
        over_plain.append(v["mlxspec model auto"] / v["plain"])
random.seed(0)
boot = sorted(st.median(random.choices(over_mlx_lm, k=len(over_mlx_lm))) for _ in range(5000))
print(f"pairs {len(over_mlx_lm)}; over mlx-lm k=3: median {st.median(over_mlx_lm):.3f}, quartiles "
      f"{[round(q, 3) for q in st.quantiles(over_mlx_lm, n=4)]}, share >= 1.3 "
      f"{sum(x >= 1.3 for x in over_mlx_lm) / len(over_mlx_lm):.2f}, bootstrap 90 % interval of the median "
      f"{boot[250]:.3f}-{boot[4750]:.3f}; over plain: median {st.median(over_plain):.3f}")
