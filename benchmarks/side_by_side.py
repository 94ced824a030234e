"""What the side-by-side benchmark scripts (blas_layout.py, padded_passes.py) share:
a spread of run-by-run figures, and writing and printing their summary."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3), "n": len(xs)}


def finish(out: dict, path: Path, per_pass: dict | None = None) -> int:
    """Write `out` (with "tok_s", "ratios" and "outputs_identical") to `path`, print it in
    short, and return the exit status: 0 when every output was identical."""
    path.write_text(json.dumps(out, indent=1))
    for k, v in out["tok_s"].items():
        extra = f", {per_pass[k]['median']:.2f} tokens/pass" if per_pass else ""
        print(f"{k:14s} {v['median']:.2f} tok/s ({v['min']:.2f}-{v['max']:.2f}){extra}")
    for k, v in out["ratios"].items():
        print(f"{k:26s} {v['median']:.2f}x ({v['min']:.2f}-{v['max']:.2f}, n={v['n']})")
    identical = out["outputs_identical"]
    print("all outputs identical" if identical else "OUTPUTS DIFFER")
    return 0 if identical else 1
