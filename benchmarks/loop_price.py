"""What the loop pays beyond the calibrated passes: each round paired with its own passes,
timed right after it (issue 60, item 4).

    python benchmarks/loop_price.py                         # the code suite, 2 prompts, 48 tokens, trees
    python benchmarks/loop_price.py --chains --repeats 2 --out loop-price-chains.json

A calibration taken minutes before a run prices it at that moment's speed, and on a
shared machine the speed moves (plain steps of 74-107 ms within four minutes here), so
a run against its calibration mixes what the loop pays with how busy the machine was.
Pairing does not: after each round of a real greedy generation (the default decoder,
`decoder.generate`, no detokenizer), the generation waits while the same work is timed
the way calibrate times it -- the target's pass over the round's verify width and the
draft's forwards over their widths, each on its own caches at the round's context, its
argmax evaluated (the shortest of two) -- and one plain step besides.  Then:

* `beyond`: the round's time less its paired passes: the loop's host work (Python, the
  tree's building and walking, the draft's distributions, the greedy choice, the
  commits, the synchronisations), per round;
* `vs_price`: the round's time over the calibrated price of its work (cost_model) times
  the paired plain step: 1.0 where the calibration prices the loop exactly.

The first round (it includes the prompt) is left out.  Outputs are the decoder's
own (greedy); no figure enters a decision.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.api import encode_prompt, make_decoder, make_drafter  # noqa: E402
from mlxspec.core.cache import ModelState  # noqa: E402
from mlxspec.core.sampling import SamplingParams  # noqa: E402
from mlxspec.core.stats import GenerationStats  # noqa: E402
from mlxspec.costs.cost_model import _draft_state, width_pass  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import arguments, chosen_prompts  # noqa: E402


def timed_forward(state, history: list[int], width: int) -> float:
    """Seconds of calibrate's pass of `state` over `width` positions after `history`."""
    t0 = time.perf_counter()
    width_pass(state, history, width, history[-1:] * width)
    return time.perf_counter() - t0


def paired_rounds(pair, decoder, ids: list[int], max_tokens: int) -> list[dict]:
    """Every round after the first of one greedy generation, with its paired passes."""
    cost = decoder.policy.cost
    target = ModelState(pair.target)
    target.prefill(list(ids))
    draft = None
    if pair.draft is not None:
        drafter = make_drafter(pair, "model")
        drafter.prefill(list(ids))
        draft = _draft_state(drafter)
    history, stats = list(ids), GenerationStats()
    stats.rounds = []
    decoder.reset()
    rows, seen = [], 0
    resumed = time.perf_counter()
    for _ in decoder.generate(history, SamplingParams(), max_tokens=max_tokens, stats=stats):
        if len(stats.rounds) == seen:
            continue  # a later token of the same round
        round_s = time.perf_counter() - resumed
        seen = len(stats.rounds)
        widths, verify, emitted = stats.rounds[-1]
        if seen > 1:
            context = history[:-1]  # the round's context: its first token is appended already
            v = min(timed_forward(target, context, verify) for _ in range(2))
            d = min(sum(timed_forward(draft, context, w) for w in widths) for _ in range(2)) if widths else 0.0
            plain = min(timed_forward(target, context, 1) for _ in range(2))
            price = sum(cost.draft_width(w) for w in widths) + cost.verify_width(verify)
            rows.append({"draft_widths": list(widths), "verify_width": verify, "emitted": emitted,
                         "round_ms": 1000 * round_s, "verify_ms": 1000 * v, "draft_ms": 1000 * d,
                         "plain_ms": 1000 * plain, "beyond_ms": 1000 * (round_s - v - d),
                         "vs_price": round_s / (price * plain)})
        resumed = time.perf_counter()
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for kind, rs in (("speculative", [r for r in rows if r["draft_widths"]]),
                     ("plain", [r for r in rows if not r["draft_widths"]])):
        if len(rs) < 2:
            continue
        q = statistics.quantiles([r["beyond_ms"] for r in rs], n=4)
        out[kind] = {"rounds": len(rs), "round_ms": statistics.median(r["round_ms"] for r in rs),
                     "beyond_ms": statistics.median(r["beyond_ms"] for r in rs), "beyond_iqr_ms": [q[0], q[2]],
                     "vs_price": statistics.median(r["vs_price"] for r in rs),
                     "plain_ms": statistics.median(r["plain_ms"] for r in rs)}
    return out


def main() -> int:
    args = arguments(__doc__, "binary-search,complete-class", 48, "loop-price.json", repeats=2,
                     extra=lambda ap: ap.add_argument("--chains", action="store_true", help="chains, not trees"))
    pair = mlxspec.load()
    decoder = make_decoder(pair, tree=False if args.chains else None)
    rows = []
    for rep in range(args.repeats):
        for p in chosen_prompts(args):
            ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
            rows += [dict(r, prompt=p["id"], repeat=rep) for r in paired_rounds(pair, decoder, ids, args.max_tokens)]
            print(f"repeat {rep + 1}/{args.repeats}: {p['id']}", flush=True)
    out = {"chains": args.chains, "max_tokens": args.max_tokens, "cost_model": decoder.policy.cost.describe(),
           "summary": summary(rows), "rounds": rows}
    args.out.write_text(json.dumps(out, indent=1))
    for kind, s in out["summary"].items():
        print(f"{kind}: {s['rounds']} rounds of {s['round_ms']:.1f} ms; beyond the paired passes {s['beyond_ms']:.1f} ms "
              f"(IQR {s['beyond_iqr_ms'][0]:.1f} to {s['beyond_iqr_ms'][1]:.1f}); round / (price x plain step) "
              f"{s['vs_price']:.3f}; paired plain step {s['plain_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
