"""A compiled draft step of the default pair, timed in two checkouts of mlxspec, alternating processes.

    python draft_step_ab.py BASE_TREE NEW_TREE [--pairs 3] [--width 1] [--seconds 12]

Each process runs step_loop.py's loop on the mlxspec of its tree (PYTHONPATH): the median and
minimum in ms.  Processes alternate base / new, `pairs` times."""
import argparse
import os
import subprocess
import sys

INNER = r"""
import os, statistics, sys
sys.path.insert(0, os.environ["HERE"])
from step_loop import timed
times = timed(float(os.environ["SECS"]), int(os.environ["W"]))
print(f"n {len(times)} median {statistics.median(times) * 1e3:.2f} ms min {min(times) * 1e3:.2f} ms")
"""

ap = argparse.ArgumentParser()
ap.add_argument("base"), ap.add_argument("new")
ap.add_argument("--pairs", type=int, default=3)
ap.add_argument("--width", type=int, default=1)
ap.add_argument("--seconds", type=float, default=12)
a = ap.parse_args()
for i in range(a.pairs):
    for name, tree in (("base", a.base), ("new", a.new)):
        env = {**os.environ, "PYTHONPATH": tree, "W": str(a.width), "SECS": str(a.seconds),
               "HERE": os.path.dirname(os.path.abspath(__file__))}
        out = subprocess.run([sys.executable, "-c", INNER], env=env, capture_output=True, text=True)
        print(f"pair {i + 1} {name:4} width {a.width}: {out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]}",
              flush=True)
