"""Draft-length rules compared without a clock: real generations, priced by the cost model.

    python benchmarks/priced_rounds.py                           # the code suite, 64 tokens
    python benchmarks/priced_rounds.py --suite chat --max-tokens 128

Each contender generates greedily on each prompt of the suite with the default pair
(a fresh decoder, as `mlxspec bench` does), and every forward of a round is priced by
the pair's calibrated cost model (cost_model.py): a target pass over w positions
V(w), a draft forward over w positions its calibrated cost (as tree_budget.py prices draft
widths); prefill is not counted.  The predicted speed-up is tokens over that price
(plain decoding costs 1 per token).  Greedy outputs and the rules' decisions are
deterministic, so two rules compare without timing noise -- on the cost model's
figures, which `mlxspec bench` then checks against the clock.  Contenders: trees and
chains, each with the bar min(R, E/T) (as shipped) and with the round's own E/T
("round bar", draft_length.py).  Needs the pair pulled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import cache, tree_attention  # noqa: E402
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


def priced(decoder, log) -> tuple[float, float]:
    """(verify, draft) plain steps that the forwards in `log` cost, by `decoder`'s cost model."""
    cm = decoder.policy.cost
    verify = sum(cm.verify_width(w) for state, w in log if state is decoder.target)
    draft = sum(cm.draft_width(w) for state, w in log if state is not decoder.target)
    return verify, draft


def main() -> int:
    args = arguments(__doc__, "0", 64, "priced-rounds.json", repeats=1)
    pair = mlxspec.load()
    rows, totals = [], {name: [0, 0.0] for name in CONTENDERS}
    for p in chosen_prompts(args):
        ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
        outputs = []
        for name, (tree, round_bar) in CONTENDERS.items():
            dec = make_decoder(pair, "model", "auto", 0.0, tree=tree)
            if round_bar:
                dec.policy.rate = lambda: None
            with Widths() as widths:
                stream = stream_generate(pair, ids, max_tokens=args.max_tokens, decoder=dec, temp=0.0, seed=0)
                outputs.append([c.token for c in stream if c.token >= 0])
            verify, draft = priced(dec, widths.log)
            s = stream.stats
            row = {"prompt": p["id"], "contender": name, "tokens": s.generated_tokens, "passes": s.target_passes,
                   "verify": round(verify, 3), "draft": round(draft, 3),
                   "predicted": round(s.generated_tokens / (verify + draft), 3)}
            rows.append(row)
            totals[name][0] += s.generated_tokens
            totals[name][1] += verify + draft
            print(f"{p['id']:16s} {name:17s} {s.generated_tokens / s.target_passes:.2f} tokens/pass, "
                  f"priced {verify + draft:.1f} plain steps: {row['predicted']:.2f}x", flush=True)
        if any(o != outputs[0] for o in outputs):
            print(f"{p['id']}: OUTPUTS DIFFER", file=sys.stderr)
            return 1
    summary = {name: round(n / t, 3) for name, (n, t) in totals.items()}
    for name, x in summary.items():
        print(f"{args.suite}, all prompts: {name:17s} {x:.3f}x predicted")
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "cost_model": dec.policy.cost.to_dict(),
                                    "rows": rows, "predicted": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
