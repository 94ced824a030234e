"""On an AVX2-only CPU (no AVX-512): the default pair with its draft's weights rounded to
int8 (draft_gemm.c's AVX2 path, the default where the kernel has it) against the same draft
kept in float16 (MLXSPEC_DRAFT_INT8=0), trees and chains, interleaved in one process.

    python benchmarks/records/2026-12-06-avx2/draft_f16_vs_int8.py --prompts 0 --max-tokens 64 --repeats 3
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import draft_weights, loading, packed_weights  # noqa: E402
from side_by_side import arguments, contender_comparison  # noqa: E402

RATIOS = ["trees / trees f16", "chains / chains f16", "trees / plain", "trees f16 / plain", "chains / plain",
          "chains f16 / plain"]


def f16_pair(pair):
    os.environ[draft_weights.ENV] = "0"
    try:
        draft = loading.load_model_dir(pair.draft_path, "draft")[0]
    finally:
        del os.environ[draft_weights.ENV]
    return dataclasses.replace(pair, draft=draft, subset_ids={})


def main() -> int:
    from mlxspec.bench_contenders import MlxspecContender, make_contender

    args = arguments(__doc__, "0", 64, "draft-f16-vs-int8.json")
    pair = mlxspec.load()
    other = f16_pair(pair)
    print("draft layouts:", packed_weights.layout(pair.draft), "|", packed_weights.layout(other.draft), flush=True)

    class On(MlxspecContender):  # runs on the float16-draft pair whatever pair it is given
        def run(self, pair, ids, **kw):
            return super().run(other, ids, **kw)

    chosen = {"plain": make_contender("plain"), "trees": make_contender("model:auto"),
              "trees f16": On("trees f16", num_draft="auto"), "chains": make_contender("model:auto:chain"),
              "chains f16": On("chains f16", num_draft="auto", tree=False)}
    return contender_comparison(args, pair, chosen, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
