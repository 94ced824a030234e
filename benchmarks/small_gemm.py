"""What the small-batch matmul kernel (mlxspec/cpu/kernel.py) gains on the CPU backend.

    python benchmarks/small_gemm.py                         # 3 code prompts, 48 tokens, 3 repeats
    python benchmarks/small_gemm.py --prompts 0 --max-tokens 64

One process, the default pair loaded once.  The kernel is switched per run
(`small_gemm.set_enabled`): off, every product goes to OpenBLAS as before.  Five
contenders run interleaved on each prompt, warm, in a rotating order per repeat:
plain decoding and the default (trees) with OpenBLAS alone, and plain, the
default and mlx-lm k=3 with the kernel.  Each setting has its own calibration
(the key names the kernel's state).  Reported: decode tok/s per contender
(median, range), run-by-run ratios of the same repeat, tokens per target pass,
and whether every greedy output is identical.  Needs the pair pulled (`mlxspec pull`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.cpu import kernel as small_gemm  # noqa: E402
from mlxspec.bench.contenders import make_contender  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, chosen_prompts, report  # noqa: E402

# name: (contender spec, kernel on)
CONTENDERS = {"plain openblas": ("plain", False), "default openblas": ("model:auto", False),
              "plain kernel": ("plain", True), "default kernel": ("model:auto", True),
              "mlx-lm k=3 kernel": ("mlx-lm:3", True)}
RATIOS = ["plain kernel / plain openblas", "default kernel / default openblas", "default kernel / plain openblas",
          "default openblas / plain openblas", "default kernel / plain kernel", "mlx-lm k=3 kernel / plain kernel",
          "default kernel / mlx-lm k=3 kernel"]


def main() -> int:
    args = arguments(__doc__, "binary-search,rust-parse,sql-query", 48, "small-gemm.json")
    if not small_gemm.loaded():
        print(f"the small-batch kernel is not loaded: {small_gemm.why()}", file=sys.stderr)
        return 2
    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    made = {name: (make_contender(spec), on) for name, (spec, on) in CONTENDERS.items()}
    names = list(made)

    def run(name, ids, n):
        c, on = made[name]
        small_gemm.set_enabled(on)
        try:
            return c.run(pair, ids, temp=0.0, max_tokens=n, seed=0)
        finally:
            small_gemm.set_enabled(True)

    return report(args, prompts, pair, names, run, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
