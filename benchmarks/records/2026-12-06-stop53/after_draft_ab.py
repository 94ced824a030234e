"""Calibrating each pass after what runs before it in decoding (FORMAT 8) against not (FORMAT 7).

Run at 6677d01, whose cost_model.py has FORMAT 8 and AFTER_DRAFT (reverted: this measured it worse):

    python benchmarks/records/2026-12-06-stop53/after_draft_ab.py --old OLD.json --suite chat,creative --max-tokens 48

One process, the default pair loaded once.  Contenders, interleaved on each prompt,
warm, in a rotating order per repeat: plain decoding; the default deciding by the
pair's cached calibration (format 8: each verify pass timed right after a draft
forward, the plain step right after a target pass, cost_model.AFTER_DRAFT); the
default deciding by OLD, a calibration file of the same pair and machine taken the
format-7 way (every width timed, the plain step after the draft's forwards of the
previous sweep, the verify passes after other target passes); and mlx-lm k=3 (with
--mlx-lm).  The two defaults differ only in the prices their rules decide by.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import calibration_cache, monotone_costs  # noqa: E402
from mlxspec.bench_contenders import make_contender  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, chosen_prompts, report  # noqa: E402

OLD = [None]  # the format-7 cost model while its contender runs
_for_decoder = calibration_cache.for_decoder


def switched(pair, drafter, **kw):
    cm = _for_decoder(pair, drafter, **kw)
    return cm if OLD[0] is None else OLD[0]


def main() -> int:
    def extra(ap):
        ap.add_argument("--old", type=Path, required=True, help="a format-7 calibration file of this pair")
        ap.add_argument("--mlx-lm", action="store_true", help="mlx-lm k=3 as a fourth contender")

    args = arguments(__doc__, "0", 64, "after-draft.json", extra=extra)
    old = monotone_costs.as_used(calibration_cache.read(args.old, fmt=None))
    calibration_cache.for_decoder = switched  # api.make_policy looks it up at each call
    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    contenders = {"plain": (make_contender("plain"), None), "after draft": (make_contender("model:auto"), None),
                  "format 7": (make_contender("model:auto"), old)}
    if args.mlx_lm:
        contenders["mlx-lm k=3"] = (make_contender("mlx-lm:3"), None)
    ratios = ["after draft / plain", "format 7 / plain", "after draft / format 7"]
    if args.mlx_lm:
        ratios += ["after draft / mlx-lm k=3", "mlx-lm k=3 / plain"]

    def run(name, ids, n):
        c, OLD[0] = contenders[name]
        try:
            return c.run(pair, ids, temp=0.0, max_tokens=n, seed=0)
        finally:
            OLD[0] = None

    return report(args, prompts, pair, list(contenders), run, ratios)


if __name__ == "__main__":
    sys.exit(main())
