"""What int8 draft weights (mlxspec/cpu/draft_weights.py) gain on the CPU backend.

    python benchmarks/draft_weights.py                      # 3 code prompts, 48 tokens, 3 repeats
    python benchmarks/draft_weights.py --prompts 0 --max-tokens 64

One process, the default pair loaded once with the draft's exact 16-bit weights
(MLXSPEC_DRAFT_INT8=0), and an int8 copy of every packed draft layer made from
it; the draft's layers are swapped per run (the target is never touched).
Contenders run interleaved on each prompt, warm, in a rotating order per repeat:
plain decoding, the default with the 16-bit draft, the default with the int8
draft, and mlx-lm k=3.  Each draft layout has its own calibration (the key names
it).  Reported: decode tok/s per contender (median, range), run-by-run ratios of
the same repeat, tokens per target pass, and whether every greedy output is
identical (it must be: the draft only proposes).  Needs the pair pulled.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["MLXSPEC_DRAFT_INT8"] = "0"  # load the draft as it is; the int8 copies are made below
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
import numpy as np  # noqa: E402
from mlxspec.cpu import draft_weights  # noqa: E402
from mlxspec.cpu.packed_weights import PackedLinear  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, swapped_comparison  # noqa: E402

CONTENDERS = {"plain": ("plain", False), "default 16-bit draft": ("model:auto", False),
              "default int8 draft": ("model:auto", True), "mlx-lm k=3": ("mlx-lm:3", False)}
RATIOS = ["default int8 draft / default 16-bit draft", "default int8 draft / plain", "default 16-bit draft / plain",
          "default int8 draft / mlx-lm k=3", "default 16-bit draft / mlx-lm k=3", "mlx-lm k=3 / plain"]


def copies(model) -> dict:
    """path -> (16-bit layer, int8 layer) for every packed layer of the draft."""
    out = {}
    for path, m in list(model.named_modules()):
        if type(m) is PackedLinear and m.in_dims % 4 == 0:
            w = np.ascontiguousarray(np.array(m.wt()).T)
            out[path] = (m, draft_weights.Int8Linear.from_rows(w, m["bias"] if "bias" in m else None))
    return out


def main() -> int:
    args = arguments(__doc__, "binary-search,rust-parse,sql-query", 48, "draft-weights.json")
    pair = mlxspec.load()
    if not draft_weights.works():
        print("int8 draft weights are not available here (no small-batch kernel)", file=sys.stderr)
        return 2
    layers = {"target": {}, "draft": copies(pair.draft)}
    return swapped_comparison(args, pair, layers, CONTENDERS, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
