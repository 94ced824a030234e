"""Draft-length rules compared without a clock: real generations, priced by the cost model.

    python benchmarks/priced_rounds.py                           # the code suite, 64 tokens
    python benchmarks/priced_rounds.py --suite chat --max-tokens 128

Each contender generates greedily on each prompt of the suite with the default pair
(a fresh decoder, as `mlxspec bench` does), and every forward of a round is priced by
the pair's calibrated cost model (costs/cost_model.py): a target pass over w positions
V(w), a draft forward over w positions its calibrated cost (as trees/budget.py prices draft
widths); prefill is not counted.  The predicted speed-up is tokens over that price
(plain decoding costs 1 per token).  Greedy outputs and the rules' decisions are
deterministic, so two rules compare without timing noise -- on the cost model's
figures, which `mlxspec bench` then checks against the clock.  Contenders: trees and
chains, each with the bar min(R, E/T) (as shipped) and with the round's own E/T
("round bar", costs/draft_length.py).  Needs the pair pulled.

    python benchmarks/priced_rounds.py --contenders trees,chains --decide a.json --decide b.json --price c.json

`--decide FILE` (repeatable): the rules decide by that cost model (a calibration file,
`mlxspec calibrate`'s cache) instead of the pair's; `--price FILE`: every run is priced
by that one (e.g. costs timed in the loop, benchmarks/round_phases.py), so two
calibrations' decisions compare on the same prices.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.core import cache
from mlxspec.costs import calibration as calibration_cache, verify_curve as monotone_costs
from mlxspec.trees import attention as tree_attention  # noqa: E402
from mlxspec.api import encode_prompt, make_decoder, stream_generate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import arguments, chosen_prompts  # noqa: E402

CONTENDERS = {"trees": (None, False), "trees round bar": (None, True), "chains": (False, False),
              "chains round bar": (False, True)}  # name: (tree, round bar)


class Widths:
    """While in use (`with Widths() as w`), records (model state, positions) of every
    forward outside prefill in `w.log`; the models' methods are restored afterwards."""

    def __init__(self):
        self.log, self._prefilling = [], False

    def __enter__(self):
        self._saved = call, block, prefill = (cache.ModelState._call, tree_attention.TreeBlock._call,
                                              cache.ModelState.prefill)

        def state_call(state, x, tree=None):
            if not self._prefilling:
                self.log.append((state, x.size))
            return call(state, x, tree)

        def block_call(blk, x, mask, positions):
            self.log.append((blk.state, x.size))
            return block(blk, x, mask, positions)

        def quiet_prefill(state, history, should_stop=None):
            self._prefilling = True
            try:
                return prefill(state, history, should_stop)
            finally:
                self._prefilling = False

        cache.ModelState._call, tree_attention.TreeBlock._call = state_call, block_call
        cache.ModelState.prefill = quiet_prefill
        return self

    def __exit__(self, *exc):
        cache.ModelState._call, tree_attention.TreeBlock._call, cache.ModelState.prefill = self._saved


def priced(decoder, log, cm=None) -> tuple[float, float]:
    """(verify, draft) plain steps that the forwards in `log` cost, by `cm` (default:
    `decoder`'s cost model)."""
    cm = cm or decoder.policy.cost
    verify = sum(cm.verify_width(w) for state, w in log if state is decoder.target)
    draft = sum(cm.draft_width(w) for state, w in log if state is not decoder.target)
    return verify, draft


def cost_file(path: Path):
    """The cost model in a calibration file of any format (calibration_cache.read), as the rules use
    it (monotone_costs.as_used, as calibration_cache.for_decoder returns it), or a one-line exit."""
    try:
        return monotone_costs.as_used(calibration_cache.read(path, fmt=None))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a calibration file ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


def options(ap) -> None:
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="of: " + ", ".join(CONTENDERS))
    ap.add_argument("--decide", type=Path, action="append", default=[],
                    help="a cost model file the rules decide by (repeatable; default: the pair's calibration)")
    ap.add_argument("--price", type=Path, help="a cost model file that prices every run (default: its own)")


def main() -> int:
    args = arguments(__doc__, "0", 64, "priced-rounds.json", repeats=1, extra=options)
    names = args.contenders.split(",")
    if any(n not in CONTENDERS for n in names):
        raise SystemExit(f"--contenders: of {', '.join(CONTENDERS)}")
    deciders = {path.stem: cost_file(path) for path in args.decide} or {"": None}
    price = cost_file(args.price) if args.price else None
    pair = mlxspec.load()
    rows, totals = [], {}
    for p in chosen_prompts(args):
        ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
        outputs = []
        for (decider, cm), name in ((d, n) for d in deciders.items() for n in names):
            tree, round_bar = CONTENDERS[name]
            dec = make_decoder(pair, "model", "auto", 0.0, tree=tree)
            if cm is not None:
                dec.policy.cost = cm
            if round_bar:
                dec.policy.rate = lambda: None
            with Widths() as widths:
                stream = stream_generate(pair, ids, max_tokens=args.max_tokens, decoder=dec, temp=0.0, seed=0)
                outputs.append([c.token for c in stream if c.token >= 0])
            verify, draft = priced(dec, widths.log, price)
            s = stream.stats
            label = f"{name} by {decider}" if decider else name
            row = {"prompt": p["id"], "contender": label, "tokens": s.generated_tokens, "passes": s.target_passes,
                   "verify": round(verify, 3), "draft": round(draft, 3),
                   "predicted": round(s.generated_tokens / (verify + draft), 3)}
            rows.append(row)
            total = totals.setdefault(label, [0, 0.0, 0])
            total[0] += s.generated_tokens
            total[1] += verify + draft
            total[2] += s.target_passes
            print(f"{p['id']:16s} {label:17s} {s.generated_tokens / s.target_passes:.2f} tokens/pass, "
                  f"priced {verify + draft:.1f} plain steps: {row['predicted']:.2f}x", flush=True)
        if any(o != outputs[0] for o in outputs):
            print(f"{p['id']}: OUTPUTS DIFFER", file=sys.stderr)
            return 1
    summary = {label: round(n / t, 3) for label, (n, t, _) in totals.items()}
    for label, (n, t, passes) in totals.items():
        print(f"{args.suite}, all prompts: {label:17s} {n / passes:.2f} tokens/pass, {n / t:.3f}x predicted")
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "cost_model": dec.policy.cost.to_dict(),
                                    "deciders": {k: v.to_dict() for k, v in deciders.items() if v},
                                    "price": price.to_dict() if price else None,
                                    "rows": rows, "predicted": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
