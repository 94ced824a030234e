"""The benchmark runner: every contender on every prompt, interleaved and rotated, after a
warm-up; records with every raw figure, and the summary."""

from __future__ import annotations

import time
from typing import Callable

from .contenders import Contender, Run, timing_figures
from .figures import check_greedy, summarize
from .prompts import Prompt, encode
from ..errors import MlxspecError

DEFAULT_MAX_TOKENS = 40
WARMUP_TOKENS = 8
NEAR_TIE = 0.05  # logit gap below which a greedy divergence is put down to float rounding


def _fmt_time(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def record_of(run: Run, contender: Contender, prompt: Prompt, prompt_tokens: int, temp: float, repeat: int,
              seed: int) -> dict:
    rec = {
        "contender": contender.name,
        "suite": prompt.suite,
        "prompt": prompt.key,
        "prompt_tokens": prompt_tokens,
        "temp": temp,
        "repeat": repeat,
        "seed": seed,
        **timing_figures(run.token_times, run.from_draft, run.total_time),
        "proposed": run.proposed,
        "accepted": run.accepted,
        "acceptance_rate": run.accepted / run.proposed if run.proposed else None,
        "target_passes": run.target_passes,
        "mean_accepted_length": len(run.tokens) / run.target_passes if run.target_passes else None,
        "proposed_by_position": run.proposed_by_position,
        "accepted_by_position": run.accepted_by_position,
        "peak_memory_bytes": run.peak_memory,
        "finish_reason": run.finish_reason,
        "tokens": run.tokens,
        "from_draft": run.from_draft,
        "token_times": [round(t, 5) for t in run.token_times],
        "matches_plain": None,
        "first_divergence": None,
    }
    if run.stats is not None:
        rec["mlxspec_stats"] = {k: v for k, v in run.stats.items() if k not in ("k_history",)}
        rec["k_history"] = run.stats.get("k_history")
    return rec


def logit_gap(model, ids: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| for the next token after `ids`, from a fresh cache:
    how close the target's choice between two greedy continuations was."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(ids, dtype=mx.uint32)[None], cache=cache)[0, -1]
    return abs(float(logits[a].item()) - float(logits[b].item()))


def explain_divergences(pair, records: list[dict], ids_by_prompt: dict) -> None:
    """For greedy mismatches, the target's logit gap between the two tokens at the
    first difference: a near-tie (float rounding of a different batch shape)
    versus a real error."""
    base = {(r["prompt"], r["repeat"]): r["tokens"] for r in records if r["contender"] == "plain" and r["temp"] == 0}
    for r in records:
        if r.get("matches_plain") is not False:
            continue
        i = r["first_divergence"]
        ref = base[(r["prompt"], r["repeat"])]
        if i is None or i >= len(ref) or i >= len(r["tokens"]):
            r["near_tie_gap"] = None
            continue
        counted = (r.get("mlxspec_stats") or {}).get("near_tie_positions")
        r["counted_near_tie"] = None if counted is None else i in counted  # the runtime's own count (core/acceptance.py)
        gap = logit_gap(pair.target, ids_by_prompt[r["prompt"]] + ref[:i], ref[i], r["tokens"][i])
        r["near_tie_gap"] = gap
        r["near_tie"] = gap < NEAR_TIE


def run_benchmark(pair, prompts: list[Prompt], contenders: list[Contender], *, temps=(0.0,), repeats: int = 1,
                  max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, warmup: bool = True,
                  echo: Callable[[str], None] = print) -> dict:
    """Run every contender on every prompt (interleaved), return records + summary."""
    t_start = time.perf_counter()
    skipped, active = [], []
    for c in contenders:
        why = c.unavailable(pair)
        if why:
            skipped.append({"contender": c.name, "spec": c.spec, "reason": why})
            echo(f"skipping {c.name}: {why}")
        else:
            active.append(c)
    if not any(c.name == "plain" for c in active):
        raise MlxspecError("the benchmark needs the 'plain' contender as its baseline")
    ids_by_prompt = {p.key: encode(pair.tokenizer, p) for p in prompts}

    warm = {}
    if warmup:
        from ..api import encode_prompt

        wids = encode_prompt(pair.tokenizer, "Say hello.", chat_template=True)
        for temp in reversed(temps):  # every temperature: mlx-lm compiles its samplers on first use
            for c in active:
                run = c.run(pair, wids, temp=temp, max_tokens=WARMUP_TOKENS, seed=seed)
                warm[c.name] = {"prompt_tokens": len(wids), "temp": temp,
                                **timing_figures(run.token_times, run.from_draft, run.total_time)}
        est = estimate_seconds(warm, active, [len(v) for v in ids_by_prompt.values()], len(temps) * repeats,
                               max_tokens)
        echo(f"warm-up done in {_fmt_time(time.perf_counter() - t_start)}; "
             f"{len(active)} contenders x {len(prompts)} prompts x {len(temps)} temps x {repeats} repeats; "
             f"rough estimate {_fmt_time(est)} (m:ss)")

    records, total = [], len(active) * len(prompts) * len(temps) * repeats
    done, interrupted = 0, False
    try:
        for temp in temps:
            for pi, prompt in enumerate(prompts):
                ids = ids_by_prompt[prompt.key]
                for rep in range(repeats):
                    shift = (pi + rep) % len(active)
                    order = active[shift:] + active[:shift]  # rotate, so no contender always goes first
                    run_seed = seed + rep
                    for c in order:
                        run = c.run(pair, ids, temp=temp, max_tokens=max_tokens, seed=run_seed)
                        rec = record_of(run, c, prompt, len(ids), temp, rep, run_seed)
                        records.append(rec)
                        done += 1
                        acc = (f", acceptance {100 * rec['acceptance_rate']:.0f}%"
                               if rec["acceptance_rate"] is not None else "")
                        echo(f"[{done}/{total} {_fmt_time(time.perf_counter() - t_start)}] {prompt.key} T={temp:g} "
                             f"#{rep}  {c.name}: {rec['generated_tokens']} tok, {rec['decode_tps']:.2f} tok/s{acc}")
    except KeyboardInterrupt:
        if not records:
            raise
        interrupted = True
        echo(f"interrupted after {done}/{total} runs: reporting those")
    check_greedy(records)
    explain_divergences(pair, records, ids_by_prompt)
    names = [c.name for c in active]
    return {
        "contenders": [c.describe() for c in active],
        "skipped": skipped,
        "prompts": [{"key": p.key, "suite": p.suite, "id": p.id, "prompt_tokens": len(ids_by_prompt[p.key])}
                    for p in prompts],
        "warmup": warm,
        "runs": records,
        "summary": summarize(records, names),
        "interrupted": interrupted,
        "elapsed_s": time.perf_counter() - t_start,
    }


def estimate_seconds(warm: dict, contenders: list[Contender], prompt_lengths: list[int], passes: int,
                     max_tokens: int) -> float:
    """Rough run time from the warm-up: decode at the warm-up rate, prompt time scaled by length."""
    total = 0.0
    for c in contenders:
        w = warm.get(c.name)
        if not w or not w["decode_tps"]:
            continue
        per_tok_prompt = w["first_round_time"] / max(w["prompt_tokens"], 1)
        for n in prompt_lengths:
            total += passes * (max_tokens / w["decode_tps"] + per_tok_prompt * n)
    return total
