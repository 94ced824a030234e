"""Timing every verify width against interpolating between a few (cost_model.TIMED_UP_TO).

    python benchmarks/every_width.py                          # the code suite, 64 tokens, 3 repeats
    python benchmarks/every_width.py --prompts 0 --suite chat --max-tokens 48

One process, the default pair loaded once, one calibration (the pair's cached one,
format 7: every width up to TIMED_UP_TO timed).  Four contenders run interleaved on
each prompt, warm, in a rotating order per repeat: plain decoding, the default
deciding by that calibration, the default deciding by the same calibration read as
format 6 did (only widths 1, 2, 3, 4, 6, 8, 12, 16, 17, 32 of the verify curve and
1, 2, 3, 4, 6, 8, 12, 16 of the draft's, linear in between), and mlx-lm k=3.  The
two defaults differ only in the prices their rules decide by.  Reported: decode
tok/s per contender (median, range), run-by-run ratios of the same repeat, tokens
per target pass, and whether every greedy output equals plain's.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import calibration_cache, cost_model, monotone_costs  # noqa: E402
from mlxspec.bench_contenders import make_contender  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, chosen_prompts, report  # noqa: E402

FORMAT_6_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 17, 32)
FORMAT_6_DRAFT_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
RATIOS = ["every width / plain", "interpolated / plain", "every width / interpolated", "every width / mlx-lm k=3",
          "interpolated / mlx-lm k=3", "mlx-lm k=3 / plain"]
INTERPOLATED = [False]
_for_decoder = calibration_cache.for_decoder


def interpolated(cm: cost_model.CostModel) -> cost_model.CostModel:
    """`cm` as format 6 would have priced the same timings: its figures at format 6's
    widths, linear in between."""
    v, d = cm.verify, cm.draft_widths
    verify = [round(x, 2) for x in cost_model._fill({w: v[w - 1] for w in FORMAT_6_WIDTHS if w <= len(v)}, len(v))]
    drafts = [round(x, 2) for x in cost_model._fill({w: d[w - 1] for w in FORMAT_6_DRAFT_WIDTHS if w <= len(d)},
                                                     len(d))] if d else d
    return replace(cm, verify=verify, draft_widths=drafts)


def switched(pair, drafter, **kw):
    cm = _for_decoder(pair, drafter, **kw)
    if not INTERPOLATED[0]:
        return cm
    # as measured, before the monotone fit
    raw = calibration_cache.load_cached(calibration_cache.cache_key(pair, drafter))
    return monotone_costs.as_used(interpolated(raw))



def main() -> int:
    args = arguments(__doc__, "0", 64, "every-width.json")
    calibration_cache.for_decoder = switched  # api.make_policy looks it up at each call
    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    contenders = {"plain": (make_contender("plain"), False), "every width": (make_contender("model:auto"), False),
                  "interpolated": (make_contender("model:auto"), True),
                  "mlx-lm k=3": (make_contender("mlx-lm:3"), False)}
    names = list(contenders)

    def run(name, ids, n):
        c, INTERPOLATED[0] = contenders[name]
        try:
            return c.run(pair, ids, temp=0.0, max_tokens=n, seed=0)
        finally:
            INTERPOLATED[0] = False

    return report(args, prompts, pair, names, run, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
