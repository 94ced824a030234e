#!/usr/bin/env python
"""Run the mlxspec benchmark from a checkout: the same as `mlxspec bench ...`.

    python benchmarks/run.py --suite code,grounded --max-tokens 64 --out results/
    python benchmarks/run.py --quick

The runner lives in mlxspec/commands/bench.py and mlxspec/bench/ (so `mlxspec bench` works after pip
install); the prompt suites are the JSON files in benchmarks/suites/.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mlxspec  # noqa: E402,F401  (preloads OpenBLAS before mlx.core)
from mlxspec.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
