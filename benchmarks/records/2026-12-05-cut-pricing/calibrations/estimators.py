"""Calibration noise: the same raw timings, two estimators.  Runs cost_model.calibrate N times
(the default pair, its model drafter) and, per run, prices each verify width (a) as shipped:
the median of its timings over the median of the one-position pass's, and (b) sweep by sweep:
the median of each timing over the one-position pass timed in the same sweep.  Prints each
estimator's figures per run and their spread across runs.  Run from the repository root:
python benchmarks/records/2026-12-05-cut-pricing/calibrations/estimators.py [N]"""
import statistics
import sys

import mlxspec
from mlxspec import cost_model
from mlxspec.api import make_drafter

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
pair = mlxspec.load()
drafter = make_drafter(pair, None, 0.0, None)
captured = []
orig = cost_model.from_times


def capture(times, relative_cost=0.0):
    captured.append({k: list(v) for k, v in times.items()})
    return orig(times, relative_cost)


cost_model.from_times = capture
for _ in range(runs):
    cost_model.calibrate(pair.target, drafter, cost_model._vocab_rows(pair))
WIDTHS = (2, 3, 4, 6, 8)
table = {"shipped": [], "per sweep": []}
for times in captured:
    one = times[1]
    table["shipped"].append({w: statistics.median(times[w]) / statistics.median(one) for w in WIDTHS})
    table["per sweep"].append({w: statistics.median(t / o for t, o in zip(times[w], one)) for w in WIDTHS})
for name, rows in table.items():
    for i, row in enumerate(rows):
        print(f"{name:9s} run {i + 1}: " + "  ".join(f"{w}:{row[w]:.2f}" for w in WIDTHS)
              + f"   plain {statistics.median(captured[i][1]) * 1000:.1f} ms")
    print(f"{name:9s} spread:  " + "  ".join(f"{w}:{max(r[w] for r in rows) - min(r[w] for r in rows):.2f}"
                                           for w in WIDTHS))
