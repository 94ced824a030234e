"""The ceiling: how fast could a draft model make this pair on this machine?

    python benchmarks/ceiling.py                               # default pair, code/chat/creative, 64 tokens
    python benchmarks/ceiling.py --suite code --prompts 0 --out bench-results/ceiling.json

For each prompt it takes the target's greedy output (plain decoding) and the draft's
greedy guess at every position of it, teacher-forced: one draft forward over the prompt
and the output gives the guesses a chain round makes up to its first rejection (after a
rejection the loop continues from the target's token, as teacher forcing does).  With
the pair's calibrated cost model (costs/cost_model.py: a draft step costs c, a verify pass
over w positions V(w), in plain target steps) it reports, per prompt:

* `oracle`: the fastest chain schedule with perfect foresight.  Each round drafts
  exactly the run of guesses that the target will accept (at most the cap), so no draft
  step and no verified position is wasted; dynamic programming over positions gives the
  least predicted time.  No chain policy can beat it.  (Its rounds are charged no
  re-feed of a round's last draft, so it stays an upper bound.)
* `auto`, `k=K`: the real draft-length policies (costs/draft_length.py) played on the same
  outcomes, chains, with the draft's confidence at each position.  Positions after a
  round's first rejection use the teacher-forced confidence (the draft's own
  continuation there is not computed): only the number of draft steps paid depends on it.
* the draft's top-1 and top-3 agreement with the target (top-3 is what a tree with
  siblings could reach, at the price of wider verify passes).

Speed-ups are predicted (tokens per plain step of the cost model), not timed: the point
is the bound, which timing noise would blur.  `mlxspec bench` measures the real thing;
on this machine its code-suite figures sit within a few percent of `auto` here.
Prompt lookup is not modelled (it drafts for free where the answer repeats the prompt).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlxspec  # noqa: E402  (preloads OpenBLAS before mlx.core)
import mlx.core as mx  # noqa: E402

from mlxspec.costs import calibration as calibration_cache, draft_length  # noqa: E402
from mlxspec.api import make_drafter  # noqa: E402
from mlxspec.commands.bench import encode, load_suite, select_prompts  # noqa: E402
from mlxspec.costs.cost_model import CostModel  # noqa: E402

CAP = draft_length.DEFAULT_MAX_K


def trace(pair, drafter, ids: list[int], max_tokens: int) -> dict:
    """The target's greedy output after `ids`, and the draft's top-3 guesses (ids,
    probabilities) at each of its positions, teacher-forced."""
    out = [t for t, _ in mlxspec.make_decoder(pair, "none").generate(list(ids), max_tokens=max_tokens,
                                                                     eos_token_ids=pair.tokenizer.eos_token_ids)]
    drafter.reset()
    drafter.prefill(ids)  # the subset widens by the conversation's tokens, as in the loop
    logits = drafter.state.model(mx.array(ids + out)[None])[0][len(ids) - 1: len(ids) - 1 + len(out)]
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    order = mx.argsort(-lp, axis=-1)[:, :3]
    probs = mx.exp(mx.take_along_axis(lp, order, axis=-1))
    if drafter.subset is not None:
        order = drafter.subset.ids[order]
    drafter.reset()
    return {"out": out, "top": order.tolist(), "p": probs.tolist()}


def oracle(match: list[bool], cm: CostModel, cap: int = CAP) -> float:
    """Predicted speed-up of the best chain schedule that knows `match` in advance."""
    n = len(match)
    best = [0.0] * (n + 1)  # best[i]: least cost to emit tokens i..n-1
    for i in range(n - 1, -1, -1):
        run = 0
        while i + run < n and match[i + run] and run < cap:
            run += 1
        best[i] = min([1.0 + best[i + 1]] + [k * cm.draft_step + cm.verify_width(k + 1) + best[min(n, i + k + 1)]
                                             for k in range(1, run + 1)])
    return n / best[0] if n else 1.0


def play(policy, match: list[bool], confidence: list[float], cm: CostModel, cap: int = CAP) -> float:
    """Predicted speed-up of `policy` (a draft_length policy) drafting chains over these outcomes."""
    n, pos, cost, fed_last = len(match), 0, 0.0, True
    if hasattr(policy, "start"):
        policy.start(None)
    while pos < n:
        k = max(0, min(policy.choose(), cap, n - pos - 1))
        rnd = policy.round(k) if k else draft_length.Round(None, 0)
        kept, steps = [], 0
        for i in range(k):
            if not rnd.more():
                break
            steps += 1
            if not rnd.offer(confidence[pos + i]):
                break
            kept.append(confidence[pos + i])
        ok = 0
        while ok < len(kept) and match[pos + ok]:
            ok += 1
        refeed = 0.0 if fed_last or not steps else cm.draft_step * (cm.verify_width(2) - 1)
        cost += steps * cm.draft_step + refeed + cm.verify_width(len(kept) + 1)
        fed_last = not (kept and ok == len(kept) == steps)  # all drafted, kept and accepted: the last one was never fed
        pos += ok + 1
        policy.update(rnd, list(zip(kept, [True] * ok + [False]))[: ok + 1])
    return n / cost if cost else 1.0


def figures(tr: dict, cm: CostModel, ks=(3, 5, 8)) -> dict:
    match = [top[0] == t for top, t in zip(tr["top"], tr["out"])]
    conf = [p[0] for p in tr["p"]]
    row = {"top1": sum(match) / len(match), "top3": sum(t in top for top, t in zip(tr["top"], tr["out"])) / len(match),
           "oracle": oracle(match, cm), "auto": play(draft_length.PerToken(cm, CAP), match, conf, cm)}
    row.update({f"k={k}": play(draft_length.FixedK(k), match, conf, cm) for k in ks})
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model"), ap.add_argument("--draft")
    ap.add_argument("--suite", default="code,chat,creative")
    ap.add_argument("--prompts", type=int, default=0, help="prompts per suite (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="bench-results/ceiling.json")
    a = ap.parse_args(argv)
    pair = mlxspec.load(a.model, a.draft)
    drafter = make_drafter(pair, "model")
    cm = calibration_cache.for_decoder(pair, drafter)
    prompts = select_prompts([load_suite(s) for s in a.suite.split(",")], a.prompts)
    rows = {}
    print(f"{pair.describe()}; cost model: {cm.describe()}; {a.max_tokens} tokens, greedy, cap {CAP}")
    print("| prompt | draft top-1 / top-3 | oracle chain | auto | k=3 | k=5 | k=8 |")
    print("|---|---|---|---|---|---|---|")
    for p in prompts:
        rows[p.key] = r = figures(trace(pair, drafter, encode(pair.tokenizer, p), a.max_tokens), cm)
        print(f"| {p.key} | {r['top1']:.2f} / {r['top3']:.2f} | {r['oracle']:.2f}x | {r['auto']:.2f}x | "
              f"{r['k=3']:.2f}x | {r['k=5']:.2f}x | {r['k=8']:.2f}x |", flush=True)
    for suite in dict.fromkeys(p.suite for p in prompts):
        rs = [r for k, r in rows.items() if k.startswith(suite + "/")]
        print(f"| {suite}, mean | {statistics.mean(r['top1'] for r in rs):.2f} / "
              f"{statistics.mean(r['top3'] for r in rs):.2f} | "
              + " | ".join(f"{statistics.mean(r[c] for r in rs):.2f}x" for c in ("oracle", "auto", "k=3", "k=5", "k=8"))
              + " |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pair": pair.describe(), "cost_model": cm.to_dict(), "max_tokens": a.max_tokens,
                               "cap": CAP, "rows": rows, "time": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
