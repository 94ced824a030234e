"""What lean layers (mlxspec/cpu/layers.py) gain on the CPU backend.

    python benchmarks/lean_ops.py                     # 3 code prompts, 48 tokens, 3 repeats
    python benchmarks/lean_ops.py --prompts 0 --max-tokens 64

One process, the default pair loaded once with mlx-lm's RoPE and RMSNorm
modules (MLXSPEC_LEAN=0; weights packed as usual), and a lean copy of each of
those modules; the modules are swapped per run.  Five contenders run
interleaved on each prompt, warm, in a rotating order per repeat: plain
decoding and the default with mlx-lm's modules, and plain, the default and
mlx-lm k=3 lean.  Each setting has its own calibration (the key names it).
Reported: decode tok/s per contender (median, range), run-by-run ratios of the
same repeat, tokens per target pass, and whether every greedy output is
identical.  Needs the pair pulled (`mlxspec pull`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["MLXSPEC_LEAN"] = "0"  # load with mlx-lm's modules; the lean copies are made below
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.cpu import layers as lean_ops  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import arguments, swap, swapped_comparison  # noqa: E402

# name: (contender spec, lean)
CONTENDERS = {"plain mlx-lm modules": ("plain", False), "default mlx-lm modules": ("model:auto", False),
              "plain lean": ("plain", True), "default lean": ("model:auto", True),
              "mlx-lm k=3 lean": ("mlx-lm:3", True)}
RATIOS = ["plain lean / plain mlx-lm modules", "default lean / default mlx-lm modules",
          "default lean / plain mlx-lm modules", "default mlx-lm modules / plain mlx-lm modules",
          "default lean / plain lean", "mlx-lm k=3 lean / plain lean", "default lean / mlx-lm k=3 lean"]


def copies(model) -> dict:
    """path -> (mlx-lm's module, its lean copy): lean_ops.prepare on the model, undone."""
    before = dict(model.named_modules())
    os.environ["MLXSPEC_LEAN"] = "1"
    lean_ops.prepare(model)
    out = {path: (before[path], m) for path, m in model.named_modules()
           if isinstance(m, (lean_ops.LeanRope, lean_ops.LeanRMSNorm))}
    swap(model, out, False)
    return out


def main() -> int:
    args = arguments(__doc__, "binary-search,rust-parse,sql-query", 48, "lean-ops.json")
    pair = mlxspec.load()
    modules = {"target": copies(pair.target), "draft": copies(pair.draft)}
    if not modules["target"]:
        print("lean layers are not available here (not the CPU backend?)", file=sys.stderr)
        return 2
    return swapped_comparison(args, pair, modules, CONTENDERS, RATIOS)

if __name__ == "__main__":
    sys.exit(main())
