"""What the small-batch matmul kernel (mlxspec/small_gemm.py) gains on the CPU backend.

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

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import backend, small_gemm  # noqa: E402
from mlxspec.api import encode_prompt  # noqa: E402
from mlxspec.bench_contenders import make_contender  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import finish, spread  # noqa: E402

# name: (contender spec, kernel on)
CONTENDERS = {"plain openblas": ("plain", False), "default openblas": ("model:auto", False),
              "plain kernel": ("plain", True), "default kernel": ("model:auto", True),
              "mlx-lm k=3 kernel": ("mlx-lm:3", True)}
RATIOS = ("plain kernel / plain openblas", "default kernel / default openblas", "default kernel / plain openblas",
          "default openblas / plain openblas", "default kernel / plain kernel", "mlx-lm k=3 kernel / plain kernel",
          "default kernel / mlx-lm k=3 kernel")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="code")
    ap.add_argument("--prompts", type=str, default="binary-search,rust-parse,sql-query",
                    help="prompt ids of the suite, comma-separated, or 0 for all")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("small-gemm.json"))
    args = ap.parse_args()
    if not small_gemm.loaded():
        print(f"the small-batch kernel is not loaded: {small_gemm.why()}", file=sys.stderr)
        return 2
    suite = json.loads((ROOT / f"benchmarks/suites/{args.suite}.json").read_text())["prompts"]
    wanted = None if args.prompts == "0" else args.prompts.split(",")
    prompts = [p for p in suite if wanted is None or p["id"] in wanted]
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

    tps = {c: [] for c in names}
    per_pass = {c: [] for c in names}
    ratios = {k: [] for k in RATIOS}
    runs, identical = [], True
    for p in prompts:
        ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
        for c in names:
            run(c, ids, 8)  # warm-up (and each setting's calibration, once)
        for r in range(args.repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            res = {c: run(c, ids, args.max_tokens) for c in order}
            t = {c: len(res[c].tokens) / res[c].total_time for c in names}  # as bench: decode time incl. prefill
            same = len({tuple(res[c].tokens) for c in names}) == 1
            identical &= same
            for c in names:
                tps[c].append(t[c])
                per_pass[c].append(len(res[c].tokens) / max(1, res[c].target_passes))
            for k in ratios:
                a, b = k.split(" / ")
                ratios[k].append(t[a] / t[b])
            runs.append({"prompt": p["id"], "repeat": r, "order": order, "tps": {c: round(v, 3) for c, v in t.items()},
                         "tokens_per_pass": {c: round(per_pass[c][-1], 2) for c in names}, "identical": same})
            print(p["id"], r, " ".join(f"{c} {v:.2f}" for c, v in t.items()),
                  "tok/pass " + "/".join(f"{per_pass[c][-1]:.2f}" for c in names),
                  "identical" if same else "DIFFERENT", flush=True)
    out = {"command": " ".join(sys.argv), "backend": backend.describe(), "suite": args.suite,
           "max_tokens": args.max_tokens, "prompts": [p["id"] for p in prompts], "repeats": args.repeats,
           "tok_s": {c: spread(v) for c, v in tps.items()}, "tokens_per_pass": {c: spread(v) for c, v in per_pass.items()},
           "ratios": {k: spread(v) for k, v in ratios.items()}, "outputs_identical": identical, "runs": runs}
    return finish(out, args.out, out["tokens_per_pass"])


if __name__ == "__main__":
    sys.exit(main())
