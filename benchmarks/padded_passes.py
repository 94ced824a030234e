"""What padding passes to a cheaper, wider width (cost_model.CostModel.pad_width) gains.

    python benchmarks/padded_passes.py                          # 3 code prompts, 64 tokens, 3 repeats
    python benchmarks/padded_passes.py --prompts 0 --suite chat

One process, the default pair loaded once, one calibration.  Four contenders run
interleaved on each prompt, warm, in a rotating order per repeat: plain decoding,
the default (trees) with padded passes, the default without padding (the cost
model read as before: each width at its own cost, made non-decreasing, nothing
padded), and mlx-lm k=3.  Reported: decode tok/s per contender (median, range),
run-by-run ratios of the same repeat, tokens per target pass, and whether every
greedy output equals plain's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.costs import cost_model  # noqa: E402
from mlxspec.bench.contenders import make_contender  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, chosen_prompts, report  # noqa: E402
PADDED = [True]
RATIOS = ["padded / plain", "unpadded / plain", "padded / unpadded", "padded / mlx-lm k=3", "unpadded / mlx-lm k=3",
          "mlx-lm k=3 / plain"]
_pad_width, _verify_width = cost_model.CostModel.pad_width, cost_model.CostModel.verify_width


def _switched_pad(self, w):
    return _pad_width(self, w) if PADDED[0] else w


def _switched_verify(self, w):
    if PADDED[0]:
        return _verify_width(self, w)
    v = self.verify  # as before padding: a width's own cost, made non-decreasing
    top = max(v[: min(w, len(v))])
    return top if w <= len(v) else max(top, _verify_width(self, w))


cost_model.CostModel.pad_width = _switched_pad
cost_model.CostModel.verify_width = _switched_verify


def main() -> int:
    args = arguments(__doc__, "binary-search,rust-parse,complete-class", 64, "padded-passes.json")
    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    contenders = {"plain": (make_contender("plain"), True), "padded": (make_contender("model:auto"), True),
                  "unpadded": (make_contender("model:auto"), False), "mlx-lm k=3": (make_contender("mlx-lm:3"), True)}
    names = list(contenders)

    def run(name, ids, n):
        c, PADDED[0] = contenders[name]
        try:
            return c.run(pair, ids, temp=0.0, max_tokens=n, seed=0)
        finally:
            PADDED[0] = True

    return report(args, prompts, pair, names, run, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
