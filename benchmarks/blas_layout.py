"""What storing linear weights transposed for BLAS (mlxspec/cpu/blas_layout.py) gains on the CPU backend.

    python benchmarks/blas_layout.py                        # binary-search and rust-parse, 3 repeats
    python benchmarks/blas_layout.py --prompts 0 --max-tokens 64

The default pair is loaded twice in one process: once in mlx-lm's layout
(MLXSPEC_BLAS_LAYOUT=0 while it loads) and once laid out for BLAS.  Four contenders
-- plain decoding and the default speculative decoding (`auto`, trees), in each
layout -- run interleaved on the code suite's prompts, warm (one short warm-up
each), in a rotating order per repeat.  Each layout has its own calibration.
Reported: decode tok/s per contender (median and range), and run-by-run ratios
of the same repeat: BLAS layout over mlx-lm's for plain and for the default, and
the default over plain within each layout.  Greedy outputs must be identical
across all four.  Needs the pair pulled (`mlxspec pull`) and ~17 GB of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import device as backend
from mlxspec.cpu import blas_layout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import finish, spread  # noqa: E402


def load(layout: str):
    os.environ[blas_layout.ENV_OFF] = "1" if layout == "blas" else "0"
    try:
        pair = mlxspec.load()
    finally:
        os.environ.pop(blas_layout.ENV_OFF, None)
    assert blas_layout.layout(pair.target) == layout, (layout, blas_layout.layout(pair.target))
    return pair



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=str, default="binary-search,rust-parse",
                    help="code-suite prompt ids, comma-separated, or 0 for all")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("blas-layout.json"))
    args = ap.parse_args()
    suite = json.loads((ROOT / "benchmarks/suites/code.json").read_text())["prompts"]
    wanted = None if args.prompts == "0" else args.prompts.split(",")
    prompts = [p for p in suite if wanted is None or p["id"] in wanted]
    pairs = {"mlx": load("mlx"), "blas": load("blas")}
    contenders = [(layout, mode) for layout in pairs for mode in ("plain", "default")]

    def run(c, msgs, n):
        layout, mode = c
        kw = {"drafter": "none"} if mode == "plain" else {}
        return mlxspec.generate(pairs[layout], msgs, max_tokens=n, **kw)

    tps = {c: [] for c in contenders}
    ratios: dict[str, list[float]] = {k: [] for k in (
        "plain: blas / mlx", "default: blas / mlx", "mlx: default / plain", "blas: default / plain",
        "default blas / plain mlx")}
    runs, identical = [], True
    for p in prompts:
        msgs = [{"role": "user", "content": p["prompt"]}]
        for c in contenders:
            run(c, msgs, 8)  # warm-up (and each layout's calibration, once)
        for r in range(args.repeats):
            order = contenders[r % 4:] + contenders[: r % 4]
            res = {c: run(c, msgs, args.max_tokens) for c in order}
            t = {c: res[c].stats.generation_tps for c in contenders}
            same = len({tuple(res[c].tokens) for c in contenders}) == 1
            identical &= same
            for c in contenders:
                tps[c].append(t[c])
            ratios["plain: blas / mlx"].append(t["blas", "plain"] / t["mlx", "plain"])
            ratios["default: blas / mlx"].append(t["blas", "default"] / t["mlx", "default"])
            ratios["mlx: default / plain"].append(t["mlx", "default"] / t["mlx", "plain"])
            ratios["blas: default / plain"].append(t["blas", "default"] / t["blas", "plain"])
            ratios["default blas / plain mlx"].append(t["blas", "default"] / t["mlx", "plain"])
            runs.append({"prompt": p["id"], "repeat": r, "order": [f"{a}-{b}" for a, b in order],
                         "tps": {f"{a}-{b}": round(v, 3) for (a, b), v in t.items()}, "identical": same})
            print(p["id"], r, " ".join(f"{a}-{b} {v:.2f}" for (a, b), v in t.items()), "identical" if same else
                  "DIFFERENT", flush=True)
    out = {"command": " ".join(sys.argv), "backend": backend.describe(), "max_tokens": args.max_tokens,
           "prompts": [p["id"] for p in prompts], "repeats": args.repeats,
           "tok_s": {f"{a}-{b}": spread(v) for (a, b), v in tps.items()},
           "ratios": {k: spread(v) for k, v in ratios.items()}, "outputs_identical": identical, "runs": runs}
    return finish(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
