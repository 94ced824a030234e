"""Run-by-run ratios of two contenders of an `mlxspec bench` results.json, per suite: the
median and range of the pairs (same prompt, temperature and repeat).

    python pairs.py bench-cc/results.json "mlxspec model auto" "mlxspec model auto chains"
"""
import collections
import json
import statistics
import sys

runs = json.load(open(sys.argv[1]))["runs"]
a, b = sys.argv[2], sys.argv[3]
tps = {(r["contender"], r["suite"], r["prompt"], r["temp"], r["repeat"]): r["decode_tps"] for r in runs}
by_suite = collections.defaultdict(list)
for (c, suite, prompt, temp, rep), v in tps.items():
    if c == a and (b, suite, prompt, temp, rep) in tps:
        by_suite[suite].append(v / tps[b, suite, prompt, temp, rep])
for suite, xs in sorted(by_suite.items()):
    print(f"{suite}: {a} / {b} median {statistics.median(xs):.3f} ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})")
