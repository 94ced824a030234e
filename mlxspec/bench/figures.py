"""Benchmark figures, pure functions: speed-ups (per prompt, then the median), the greedy
check against plain decoding, the summary rows."""

from __future__ import annotations

import statistics


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pairwise_speedup(contender_tps: dict, baseline_tps: dict) -> tuple[float | None, dict]:
    """{prompt: [tok/s per repeat]} for a contender and the baseline -> (median over
    prompts of the per-prompt ratio of medians, {prompt: ratio}).  Prompts the
    baseline lacks (or with zero speed) are left out."""
    ratios = {}
    for key, xs in contender_tps.items():
        base = median(baseline_tps.get(key, []))
        mine = median(xs)
        if base and mine is not None:
            ratios[key] = mine / base
    return median(ratios.values()), ratios


def first_divergence(a: list, b: list) -> int | None:
    """Index of the first difference between two token lists, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_greedy(records: list[dict], baseline: str = "plain") -> None:
    """Mark every temp-0 record with whether its tokens equal the baseline's for the
    same prompt and repeat (matches_plain, first_divergence)."""
    base = {(r["prompt"], r["repeat"]): r["tokens"] for r in records
            if r["contender"] == baseline and r["temp"] == 0}
    for r in records:
        if r["temp"] != 0:
            r["matches_plain"] = None
            continue
        ref = base.get((r["prompt"], r["repeat"]))
        if ref is None:
            r["matches_plain"] = None
            continue
        d = first_divergence(r["tokens"], ref)
        r["matches_plain"] = d is None
        r["first_divergence"] = d


def summarize(records: list[dict], contenders: list[str], baseline: str = "plain") -> list[dict]:
    """One row per (temp, suite, contender), plus suite 'all'."""
    rows = []
    temps = sorted({r["temp"] for r in records})
    suites = list(dict.fromkeys(r["suite"] for r in records))
    for temp in temps:
        for suite in suites + (["all"] if len(suites) > 1 else []):
            sel = [r for r in records if r["temp"] == temp and (suite == "all" or r["suite"] == suite)]
            if not sel:
                continue
            tps_by, e2e_by = {}, {}
            for r in sel:
                tps_by.setdefault(r["contender"], {}).setdefault(r["prompt"], []).append(r["decode_tps"])
                e2e_by.setdefault(r["contender"], {}).setdefault(r["prompt"], []).append(r["e2e_tps"])
            base_tps = tps_by.get(baseline, {})
            for c in contenders:
                mine = [r for r in sel if r["contender"] == c]
                if not mine:
                    continue
                per_prompt_tps = {k: median(v) for k, v in tps_by[c].items()}
                speedup, ratios = pairwise_speedup(tps_by[c], base_tps)
                proposed = sum(r["proposed"] for r in mine)
                accepted = sum(r["accepted"] for r in mine)
                passes = sum(r["target_passes"] for r in mine)
                tokens = sum(r["generated_tokens"] for r in mine)
                checked = [r["matches_plain"] for r in mine if r.get("matches_plain") is not None]
                trees = [r.get("mlxspec_stats") or {} for r in mine]
                tree_rounds = sum(t.get("tree_rounds", 0) for t in trees)
                rows.append({
                    "temp": temp,
                    "suite": suite,
                    "contender": c,
                    "prompts": len(per_prompt_tps),
                    "runs": len(mine),
                    "tokens_per_s": median(per_prompt_tps.values()),
                    "e2e_tokens_per_s": median(r["e2e_tps"] for r in mine),
                    "speedup": speedup,
                    "speedup_per_prompt": ratios,
                    "e2e_speedup": pairwise_speedup(e2e_by[c], e2e_by.get(baseline, {}))[0],  # prompt time included
                    "acceptance_rate": accepted / proposed if proposed else None,
                    "draft_proposed": proposed,
                    "draft_accepted": accepted,
                    "mean_accepted_length": tokens / passes if passes else None,
                    "draft_token_share": sum(sum(r["from_draft"]) for r in mine) / tokens if tokens else 0.0,
                    "generated_tokens": tokens,
                    "peak_memory_bytes": max(r["peak_memory_bytes"] for r in mine),
                    "greedy_match": {"matched": sum(checked), "checked": len(checked)} if checked else None,
                    "tree_nodes_per_round": sum(t.get("tree_nodes", 0) for t in trees) / tree_rounds
                    if tree_rounds else None,
                    "tree_depth_per_round": sum(t.get("tree_depth", 0) for t in trees) / tree_rounds
                    if tree_rounds else None,
                    "near_ties": sum(t.get("near_ties", 0) for t in trees),  # greedy: top-2 within rounding
                })
    return rows
