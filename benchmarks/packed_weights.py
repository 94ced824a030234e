"""What packed weights (mlxspec/cpu/packed_weights.py) gain on the CPU backend.

    python benchmarks/packed_weights.py                     # 3 code prompts, 48 tokens, 3 repeats
    python benchmarks/packed_weights.py --prompts 0 --max-tokens 64

One process, the default pair loaded once, unpacked (MLXSPEC_PACKED=0: the
float32 BLAS layout of cpu/blas_layout.py, through the small-batch kernel), and a
packed copy of every linear layer made from it (16 bits where exact); the
layers are swapped per run.  Five contenders run interleaved on each prompt,
warm, in a rotating order per repeat: plain decoding and the default unpacked,
and plain, the default and mlx-lm k=3 packed.  Each setting has its own
calibration (the key names the layout).  Reported: decode tok/s per contender
(median, range), run-by-run ratios of the same repeat, tokens per target pass,
and whether every greedy output is identical.  Needs the pair pulled
(`mlxspec pull`) and ~13 GB of memory (both copies).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["MLXSPEC_PACKED"] = "0"  # load unpacked; the packed copies are made below
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
import numpy as np  # noqa: E402
from mlxspec.cpu import packed_weights  # noqa: E402
from mlxspec.cpu.blas_layout import TransposedLinear  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, swapped_comparison  # noqa: E402

# name: (contender spec, packed)
CONTENDERS = {"plain unpacked": ("plain", False), "default unpacked": ("model:auto", False),
              "plain packed": ("plain", True), "default packed": ("model:auto", True),
              "mlx-lm k=3 packed": ("mlx-lm:3", True)}
RATIOS = ["plain packed / plain unpacked", "default packed / default unpacked", "default packed / plain unpacked",
          "default unpacked / plain unpacked", "default packed / plain packed", "mlx-lm k=3 packed / plain packed",
          "default packed / mlx-lm k=3 packed"]


def copies(model) -> dict:
    """path -> (unpacked layer, packed layer) for every TransposedLinear of `model`."""
    out = {}
    for path, m in list(model.named_modules()):
        if isinstance(m, TransposedLinear):
            w = np.ascontiguousarray(np.array(m.wt).T)
            out[path] = (m, packed_weights.PackedLinear.from_rows(w, m["bias"] if "bias" in m else None))
    return out


def main() -> int:
    args = arguments(__doc__, "binary-search,rust-parse,sql-query", 48, "packed-weights.json")
    pair = mlxspec.load()
    os.environ["MLXSPEC_PACKED"] = "16"
    if not packed_weights.available():
        print("packed weights are not available here (no small-batch kernel)", file=sys.stderr)
        return 2
    layers = {"target": copies(pair.target), "draft": copies(pair.draft)}
    formats = sorted({p.fmt for d in layers.values() for _, p in d.values()})
    return swapped_comparison(args, pair, layers, CONTENDERS, RATIOS, {"packed_formats": formats})

if __name__ == "__main__":
    sys.exit(main())
