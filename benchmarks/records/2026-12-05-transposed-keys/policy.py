"""Two questions about chain drafting on teacher-forced traces (benchmarks/ceiling.py's), predicted
by the cached cost model, not timed:

    python policy.py traces.json     # traces.json: written by `python policy.py --trace traces.json`

1. What a cheaper draft step is worth: the per-token rule (auto) with the draft step priced at
   0.26 / 0.23 / 0.20 plain steps, against k=3 chains priced at 0.26 (a draft step of ours only
   cheaper) and at the same price (both cheaper).
2. Whether a fixed rule on the draft's confidence beats auto: draft while the top probability
   (p) or the top-two margin (m) is above a threshold.
"""
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks")), sys.path.insert(0, str(ROOT))
import ceiling as C  # noqa: E402
from mlxspec import draft_length  # noqa: E402
from mlxspec.cost_model import CostModel  # noqa: E402

if sys.argv[1] == "--trace":
    import mlxspec
    from mlxspec import cost_model
    pair = mlxspec.load()
    drafter = C.make_drafter(pair, "model")
    out = {"cost_model": cost_model.for_decoder(pair, drafter).to_dict(), "traces": {}}
    for suite in ("code", "chat"):
        for p in C.select_prompts([C.load_suite(suite)], 0):
            out["traces"][p.key] = C.trace(pair, drafter, C.encode(pair.tokenizer, p), 96)
    Path(sys.argv[2]).write_text(json.dumps(out))
    sys.exit(0)

d = json.loads(Path(sys.argv[1]).read_text())
base = CostModel(**d["cost_model"])


def threshold(match, feat, th, cm, cap=12):
    """Chains that draft while feat > th (the token that fails it is drafted, not kept)."""
    n, pos, cost, fed_last = len(match), 0, 0.0, True
    while pos < n:
        kept, steps = 0, 0
        for i in range(min(cap, n - pos - 1)):
            steps += 1
            if not feat[pos + i] > th:
                break
            kept += 1
        if kept == 0:
            cost, pos, fed_last = cost + 1.0, pos + 1, True
            continue
        ok = 0
        while ok < kept and match[pos + ok]:
            ok += 1
        cost += steps * cm.draft_step + (0.0 if fed_last else cm.draft_step * (cm.verify_width(2) - 1)) \
            + cm.verify_width(kept + 1)
        fed_last = not (ok == kept == steps)
        pos += ok + 1
    return n / cost


for suite in ("code", "chat"):
    trs = [t for k, t in d["traces"].items() if k.startswith(suite)]
    outcomes = [([top[0] == t for top, t in zip(tr["top"], tr["out"])], [p[0] for p in tr["p"]],
                 [p[0] - p[1] for p in tr["p"]]) for tr in trs]
    for ds in (0.26, 0.23, 0.20):
        cm = dataclasses.replace(base, draft_step=ds)
        auto = statistics.mean(C.play(draft_length.PerToken(cm, C.CAP), m, c, cm) for m, c, _ in outcomes)
        k3 = statistics.mean(C.play(draft_length.FixedK(3), m, c, base) for m, c, _ in outcomes)
        k3same = statistics.mean(C.play(draft_length.FixedK(3), m, c, cm) for m, c, _ in outcomes)
        oracle = statistics.mean(C.oracle(m, cm) for m, _, _ in outcomes)
        print(f"{suite}, draft step {ds}: oracle {oracle:.2f}x, auto {auto:.2f}x; auto over k=3 at 0.26 "
              f"{auto / k3:.3f}, over k=3 at {ds} {auto / k3same:.3f}")
    rules = {f"{name}>{th}": statistics.mean(threshold(m, f, th, base) for m, *fs in outcomes for f in [fs[i]])
             for i, name in enumerate(("p", "m")) for th in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)}
    best = max(rules, key=rules.get)
    print(f"{suite}: auto {statistics.mean(C.play(draft_length.PerToken(base, C.CAP), m, c, base) for m, c, _ in outcomes):.3f}x;"
          f" best fixed rule {best} {rules[best]:.3f}x; all: " + ", ".join(f"{k} {v:.2f}" for k, v in rules.items()))
