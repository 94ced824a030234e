"""`mlxspec bench --quick`: will speculation pay with this pair here?

Acceptance by draft position is measured on a few prompts (drafting max_k per
round); the costs come from the pair's calibrated cost model (costs/cost_model.py: the
same figures the per-token policy decides from, measured once and cached).  From
both: the predicted speed-up of each fixed k, and what `--num-draft auto` (the
default) would do, walked with the policy's own rule (draft_length.Round).
"""

from __future__ import annotations

import time
from typing import Callable

from .contenders import MlxspecContender
from .prompts import Prompt, encode
from .runner import _fmt_time
from ..costs.draft_length import Round
from ..errors import MlxspecError

# Enough rounds to measure acceptance by position: 16 tokens of one prompt (4-5 rounds at k = 6) predicted
# 1.30x for k = 4 on the default pair where bench then measured 1.57x (2026-12-01 record).
QUICK_MAX_TOKENS = 48
QUICK_PROMPTS = 1  # per suite; `--prompts N` for more


def expected_tokens(acc_by_position: list[float], k: int) -> float:
    """Tokens per round with k drafts from per-position acceptance A_i = P(drafts 0..i all kept)."""
    return 1.0 + sum(acc_by_position[:k])


def expected_tokens_geometric(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): Leviathan et al. with per-token acceptance a."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def per_token_acceptance(proposed: list[int], accepted: list[int]) -> float:
    """Fit of a per-token acceptance a: drafts kept over drafts judged (a draft is judged
    only when every earlier draft of its round was kept)."""
    judged = 0
    for i, p in enumerate(proposed):
        judged += p if i == 0 else min(p, accepted[i - 1])
    return sum(accepted) / judged if judged else 0.0


def predict(acc_by_position: list[float], a: float, c: float, verify_ratio: dict) -> list[dict]:
    """Predicted speed-up per k: E[tokens per round] / (k*c + verify(k)/verify(0))."""
    rows = []
    for k in sorted(verify_ratio):
        if k == 0 or k > len(acc_by_position):
            continue
        cost = k * c + verify_ratio[k]
        e_pos, e_geo = expected_tokens(acc_by_position, k), expected_tokens_geometric(a, k)
        rows.append({"k": k, "expected_tokens": e_pos, "expected_tokens_geometric": e_geo, "cost": cost,
                     "speedup": e_pos / cost, "speedup_geometric": e_geo / cost})
    return rows



def recommend(rows: list[dict], margin: float = 1.05) -> dict:
    """The fixed k with the best predicted speed-up; k = 0 (no drafting) below `margin`."""
    if not rows:
        return {"k": 0, "speedup": None, "pays": False}
    best = max(rows, key=lambda r: r["speedup"])
    return {"k": best["k"] if best["speedup"] >= margin else 0, "best_k": best["k"], "speedup": best["speedup"],
            "pays": best["speedup"] >= margin}


class _Measured:
    """Stands in for draft_length.PerToken inside a Round: the acceptance is the one
    measured at the position being decided, the costs the pair's cost model."""

    forced = False

    def __init__(self, cost):
        self.cost, self.a = cost, 0.0

    def mean_acceptance(self, lookup: bool = False, optimistic: bool = False) -> float:
        return self.a

    def acceptance(self, confidence) -> float:
        return self.a


def policy_round(acc_by_position: list[float], cost, max_k: int) -> dict:
    """What the per-token policy (`--num-draft auto`) does with this acceptance and these
    costs: its own rule (Round.more / Round.offer), fed the conditional acceptance of
    each position.  k = 0: it falls back to plain decoding."""
    pol = _Measured(cost)
    rnd = Round(pol, max_k)
    prev = 1.0
    for cumulative in acc_by_position[:max_k]:
        pol.a = cumulative / prev if prev > 0 else 0.0
        prev = cumulative
        if not (rnd.more() and rnd.offer(None)):
            break
    return {"k": rnd.kept, "expected_tokens": rnd.e, "cost": rnd.t, "speedup": rnd.e / rnd.t,
            "stop_reason": rnd.stop_reason if rnd.kept < max_k else "cap"}


def advise(pair, prompts: list[Prompt], *, temp: float = 0.0, max_tokens: int = QUICK_MAX_TOKENS, max_k: int = 6,
           seed: int = 0, echo: Callable[[str], None] = print, cost=None) -> dict:
    """Measure acceptance by position (drafting max_k per round); predict the speed-up per k
    and of the per-token policy from the pair's calibrated cost model (`cost`: one to use
    instead, e.g. in tests)."""
    if pair.draft is None:
        raise MlxspecError("--quick measures a draft model against its target, and none is loaded: "
                           "pass --draft MODEL (or a pair folder)")
    t0 = time.perf_counter()
    if cost is None:
        from ..costs import calibration as calibration_cache
        from ..api import make_drafter

        cost = calibration_cache.for_decoder(pair, make_drafter(pair, "model"), say=echo)
    contender = MlxspecContender(f"mlxspec model k={max_k}", "model", max_k)
    from ..api import encode_prompt

    contender.run(pair, encode_prompt(pair.tokenizer, "Say hello.", chat_template=True), temp=temp,
                  max_tokens=4, seed=seed)  # warm-up
    prop, acc = [0] * max_k, [0] * max_k
    draft_time = drafted = tokens = gen_time = 0
    for p in prompts:
        s = contender.run(pair, encode(pair.tokenizer, p), temp=temp, max_tokens=max_tokens, seed=seed).stats
        for i, (pp, aa) in enumerate(zip(s["proposed_by_position"], s["accepted_by_position"])):
            prop[i] += pp
            acc[i] += aa
        draft_time += s["draft_time"]
        drafted += s["draft_proposed"]
        tokens += s["generated_tokens"]
        gen_time += s["generation_time"]
        echo(f"  {p.key}: {s['generated_tokens']} tokens, acceptance {100 * s['acceptance_rate']:.0f}% "
             f"({_fmt_time(time.perf_counter() - t0)})")
    acc_by_pos = [a / p if p else 0.0 for a, p in zip(acc, prop)]
    a = per_token_acceptance(prop, acc)
    c = cost.draft_step
    verify_ratio = {k: cost.verify_width(k + 1) for k in range(max_k + 1)}
    rows = predict(acc_by_pos, a, c, verify_ratio)
    measured_tps = tokens / gen_time if gen_time else 0.0
    step_s = cost.plain_step_s or None
    return {
        "temp": temp, "prompts": [p.key for p in prompts], "max_tokens": max_tokens, "max_k": max_k,
        "proposed_by_position": prop, "accepted_by_position": acc, "acceptance_by_position": acc_by_pos,
        "acceptance_rate": sum(acc) / sum(prop) if sum(prop) else 0.0, "per_token_acceptance": a,
        "cost_model": cost.to_dict(), "target_step_s": step_s, "cost_ratio_c": c,
        "run_draft_step": (draft_time / drafted / step_s) if drafted and step_s else None,
        "verify_ratio": {str(k): v for k, v in verify_ratio.items()},
        "run_tokens_per_s": measured_tps,
        "run_speedup_vs_target_step": measured_tps * step_s if step_s else None,
        "predictions": rows, "recommendation": recommend(rows), "auto": policy_round(acc_by_pos, cost, max_k),
        "elapsed_s": time.perf_counter() - t0,
    }


def format_advice(adv: dict, pair_desc: str) -> str:
    rec, auto, cm = adv["recommendation"], adv["auto"], adv["cost_model"]
    step = f"plain target step {1000 * adv['target_step_s']:.1f} ms; " if adv["target_step_s"] else ""
    in_runs = f" (in the runs: {adv['run_draft_step']:.2f})" if adv.get("run_draft_step") else ""
    lines = [
        f"Will it pay?  {pair_desc}",
        f"  calibrated costs ({cm['source']}; `mlxspec calibrate` re-measures): {step}"
        f"draft step = cost ratio c = {adv['cost_ratio_c']:.2f} plain steps{in_runs}",
        "  verify over k+1 positions / 1 position: "
        + ", ".join(f"k={k} {v:.2f}" for k, v in adv["verify_ratio"].items() if k != "0"),
        f"  acceptance by position (T={adv['temp']:g}, {len(adv['prompts'])} prompts, k={adv['max_k']}): "
        + " ".join(f"{100 * x:.0f}%" for x in adv["acceptance_by_position"])
        + f"; per-token a = {adv['per_token_acceptance']:.2f}",
        "",
        "   k  E[tokens/round]  (geometric)  cost/round  predicted speed-up  (geometric)",
    ]
    for r in adv["predictions"]:
        mark = "  <-" if rec.get("pays") and r["k"] == rec["k"] else ""
        lines.append(f"  {r['k']:2d}  {r['expected_tokens']:15.2f}  {r['expected_tokens_geometric']:11.2f}  "
                     f"{r['cost']:10.2f}  {r['speedup']:17.2f}x  {r['speedup_geometric']:10.2f}x{mark}")
    if auto["k"]:
        lines.append(f"  auto (the default, the per-token policy): about {auto['k']} drafts per round, "
                     f"predicted {auto['speedup']:.2f}x")
        lines.append("  (predicted for chains; the default also verifies token trees grown from prompt lookup's spine "
                     "where the model allows, which `mlxspec bench` measures: model:auto vs model:auto:chain)")
    else:
        lines.append("  auto (the default, the per-token policy): falls back to plain decoding (1.00x)")
    at_max = next((r for r in adv["predictions"] if r["k"] == adv["max_k"]), None)
    if adv.get("run_speedup_vs_target_step"):
        lines.append(f"  (check: drafting k={adv['max_k']}, the runs made {adv['run_tokens_per_s']:.2f} tok/s = "
                     f"{adv['run_speedup_vs_target_step']:.2f}x one target step per token"
                     + (f"; predicted {at_max['speedup']:.2f}x)" if at_max else ")"))
    lines.append("")
    if not rec["pays"]:
        best = "-" if rec["speedup"] is None else f"{rec['speedup']:.2f}x at k={rec['best_k']}"
        lines.append(f"Recommended: --no-draft: speculation is not predicted to pay with this pair here (best {best}).")
    elif auto["k"] and auto["speedup"] >= 0.97 * rec["speedup"]:
        lines.append(f"Recommended: the default, --num-draft auto (predicted {auto['speedup']:.2f}x over plain "
                     f"decoding; the best fixed k, --num-draft {rec['k']}, {rec['speedup']:.2f}x).")
    else:
        lines.append(f"Recommended: --num-draft {rec['k']} (predicted {rec['speedup']:.2f}x over plain decoding).")
    return "\n".join(lines)
