"""Drafters and draft-length policies, side by side in one process.

    python benchmarks/drafters.py                       # the default pair (Qwen2.5-Coder 1.5B / 0.5B)
    python benchmarks/drafters.py --model smollm2-135m --draft smollm2-135m --max-tokens 24 --repeats 1

Three suites, each a set of contenders run on the same prompt token ids:

* adaptive  -- greedy code generation: the draft model with the adaptive policy
               (`model:auto`) against every fixed k in --ks (`model:K`) and plain
               decoding; reports auto against the best fixed k and against k = 3;
* lookup    -- a code-editing prompt (the answer mostly quotes the input): prompt
               lookup (`lookup:auto`) against plain decoding, with the draft model
               for reference;
* fallback  -- a creative prompt at temperature 1.5: `model:auto` must stay
               >= 0.95x plain decoding (it should stop drafting), `model:3` shown
               for reference.

Method: contenders run interleaved (repeat r runs them all, in an order rotated by r),
so drift of a shared machine hits all alike; each contender first runs one short
warm-up generation that is discarded; every run gets a fresh decoder (a fresh
policy, as a new `mlxspec generate` would), so the adaptive policy's exploration
is paid in every run.  Speed is decode tokens per second from the loop's stats
(prompt prefill excluded, for all contenders alike; EOS is ignored so every run
produces --max-tokens tokens); the figure per contender is the median over
repeats, and ratios are taken against plain decoding's median in the same suite
(the table also shows the range of per-repeat ratios against the same repeat's
plain run, a gauge of the machine's drift).  Greedy runs are checked token-identical to plain decoding.
Writes a table to the terminal and every raw figure to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import mlxspec  # noqa: F401  (preloads OpenBLAS before mlx.core)
from mlxspec.api import encode_prompt, make_decoder
from mlxspec.device import describe
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.stats import GenerationStats

CODE_PROMPT = ("Write a Python function `merge_intervals(intervals)` that merges overlapping closed intervals "
               "given as a list of (start, end) tuples and returns them sorted. Include a docstring and a few "
               "doctest examples.")

EDIT_SOURCE = '''\
def common_prefix(a, b):
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ModelState:
    def __init__(self, model):
        self.model = model
        self.cache = make_prompt_cache(model)
        self.tokens = []
        self.positions = 0

    def sync(self, history):
        if not history:
            raise ValueError("empty token history")
        keep = min(common_prefix(self.tokens, history), len(history) - 1)
        if keep < len(self.tokens):
            trim_prompt_cache(self.cache, len(self.tokens) - keep)
            del self.tokens[keep:]
        return history[keep:]

    def reset(self):
        self.cache = make_prompt_cache(self.model)
        self.tokens = []
'''
EDIT_PROMPT = ("Rename the attribute `tokens` to `cached_tokens` everywhere in this code and reply with the "
               "complete updated code only, no explanation:\n\n```python\n" + EDIT_SOURCE + "```")

CREATIVE_PROMPT = "Write a short, strange poem about a lighthouse that dreams in colours nobody has seen."


def suites(ks, draft_kind):
    fixed = [f"{draft_kind}:{k}" for k in ks]
    return {
        "adaptive": dict(prompt=CODE_PROMPT, temp=0.0,
                         contenders=["plain"] + fixed + [f"{draft_kind}:auto"]),
        "lookup": dict(prompt=EDIT_PROMPT, temp=0.0,
                       contenders=["plain", "lookup:auto", f"{draft_kind}:auto"]),
        "fallback": dict(prompt=CREATIVE_PROMPT, temp=1.5,
                         contenders=["plain", f"{draft_kind}:auto", f"{draft_kind}:3"]),
    }


def parse(contender):
    if contender == "plain":
        return "none", 0
    drafter, _, k = contender.partition(":")
    return drafter, ("auto" if k in ("", "auto") else int(k))


def run_once(pair, contender, ids, temp, seed, max_tokens):
    drafter, k = parse(contender)
    dec = make_decoder(pair, drafter, k)
    stats = GenerationStats()
    params = SamplingParams(temp=temp, seed=seed)
    history = list(ids)
    tokens = [t for t, _ in dec.generate(history, params, max_tokens=max_tokens,
                                         eos_token_ids=(), stats=stats)]
    return tokens, stats


def summarise_run(tokens, stats):
    ks = stats.k_history
    return {
        "tokens": len(tokens),
        "tps": stats.generation_tps,
        "generation_time": stats.generation_time,
        "prompt_time": stats.prompt_time,
        "acceptance": stats.acceptance_rate,
        "tokens_per_pass": stats.tokens_per_pass,
        "tokens_plain": stats.tokens_plain,
        "tokens_speculative": stats.tokens_speculative,
        "mean_k": sum(ks) / len(ks) if ks else 0.0,
        "k_history": ks,
        "acceptance_by_position": stats.acceptance_by_position,
        "draft_time": stats.draft_time,
        "verify_time": stats.verify_time,
        "notes": list(stats.notes),
        "drafter": stats.drafter,
    }


def run_suite(pair, name, spec, repeats, max_tokens, warmup_tokens, log):
    ids = encode_prompt(pair.tokenizer, spec["prompt"], chat_template=True)
    contenders = spec["contenders"]
    temp = spec["temp"]
    log(f"\n== {name}: {len(ids)} prompt tokens, temp {temp}, {max_tokens} tokens, "
        f"{repeats} repeat(s) of {', '.join(contenders)}")
    for c in contenders:  # warm-up, discarded
        run_once(pair, c, ids, temp, 0, warmup_tokens)
    runs = {c: [] for c in contenders}
    reference = {}
    for r in range(repeats):
        order = contenders[r % len(contenders):] + contenders[: r % len(contenders)]
        for c in order:
            seed = 1000 + r  # same seed for every contender in a repeat
            tokens, stats = run_once(pair, c, ids, temp, seed, max_tokens)
            rec = summarise_run(tokens, stats)
            if temp == 0:
                if c == "plain":
                    reference[r] = tokens
                rec["tokens_ids"] = tokens
            runs[c].append(rec)
            log(f"  [{name} r{r}] {c:>14}: {rec['tps']:6.2f} tok/s, acceptance {100 * rec['acceptance']:5.1f}%, "
                f"{rec['tokens_per_pass']:.2f} tok/pass, mean k {rec['mean_k']:.2f}, "
                f"plain/spec tokens {rec['tokens_plain']}/{rec['tokens_speculative']}")
    rows = {}
    plain_tps = statistics.median(x["tps"] for x in runs["plain"])
    for c in contenders:
        recs = runs[c]
        tps = statistics.median(x["tps"] for x in recs)
        # the same repeat's plain run: paired ratios show how much the machine drifted
        paired = [rec["tps"] / p["tps"] for rec, p in zip(recs, runs["plain"]) if p["tps"]]
        same = None
        if temp == 0:
            same = all(rec["tokens_ids"] == reference[i] for i, rec in enumerate(recs))
        rows[c] = {
            "tps": tps,
            "speedup": tps / plain_tps if plain_tps else 0.0,
            "paired_speedups": paired,
            "acceptance": statistics.median(x["acceptance"] for x in recs),
            "tokens_per_pass": statistics.median(x["tokens_per_pass"] for x in recs),
            "mean_k": statistics.median(x["mean_k"] for x in recs),
            "tokens_plain": sum(x["tokens_plain"] for x in recs),
            "tokens_speculative": sum(x["tokens_speculative"] for x in recs),
            "same_as_plain": same,
            "notes": sorted({n for x in recs for n in x["notes"]}),
        }
    for recs in runs.values():
        for rec in recs:
            rec.pop("tokens_ids", None)
    return {"prompt": spec["prompt"], "prompt_tokens": len(ids), "temp": temp, "contenders": contenders,
            "rows": rows, "runs": runs}


def headline(results, draft_kind):
    out = {}
    a = results.get("adaptive")
    if a:
        rows = a["rows"]
        fixed = {c: r for c, r in rows.items() if c.startswith(f"{draft_kind}:") and not c.endswith(":auto")}
        auto = rows[f"{draft_kind}:auto"]["tps"]
        best_c = max(fixed, key=lambda c: fixed[c]["tps"])
        out["adaptive_vs_best_fixed"] = {"best_fixed": best_c, "ratio": auto / fixed[best_c]["tps"]}
        if f"{draft_kind}:3" in rows:
            out["adaptive_vs_k3"] = auto / rows[f"{draft_kind}:3"]["tps"]
        out["adaptive_vs_plain"] = rows[f"{draft_kind}:auto"]["speedup"]
    lk = results.get("lookup")
    if lk:
        out["lookup_vs_plain"] = lk["rows"]["lookup:auto"]["speedup"]
    fb = results.get("fallback")
    if fb:
        r = fb["rows"][f"{draft_kind}:auto"]
        out["fallback_auto_vs_plain"] = r["speedup"]
        out["fallback_ok"] = r["speedup"] >= 0.95
        out["fallback_tokens_plain_spec"] = [r["tokens_plain"], r["tokens_speculative"]]
        if f"{draft_kind}:3" in fb["rows"]:
            out["fallback_k3_vs_plain"] = fb["rows"][f"{draft_kind}:3"]["speedup"]
    return out


def table(results):
    lines = [f"{'suite':9} {'contender':>15} {'tok/s':>7} {'x plain':>8} {'paired range':>13} {'accept':>7} "
             f"{'tok/pass':>8} {'mean k':>6} {'plain/spec tok':>14} {'same':>5}"]
    for name, res in results.items():
        for c, r in res["rows"].items():
            same = "-" if r["same_as_plain"] is None else ("yes" if r["same_as_plain"] else "NO")
            pr = r["paired_speedups"]
            rng = f"{min(pr):.2f}-{max(pr):.2f}" if pr else "-"
            lines.append(f"{name:9} {c:>15} {r['tps']:7.2f} {r['speedup']:7.2f}x {rng:>13} {100 * r['acceptance']:6.1f}% "
                         f"{r['tokens_per_pass']:8.2f} {r['mean_k']:6.2f} "
                         f"{str(r['tokens_plain']) + '/' + str(r['tokens_speculative']):>14} {same:>5}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target (default: the default pair)")
    ap.add_argument("--draft", default=None, help="draft model (default: the pair's)")
    ap.add_argument("--suites", default="adaptive,lookup,fallback")
    ap.add_argument("--ks", default="1,2,3,4,5", help="fixed k contenders in the adaptive suite")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup-tokens", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results/drafters.json")
    a = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    pair = mlxspec.load(a.model, a.draft)
    draft_kind = "model" if pair.draft is not None else "layerskip"
    if draft_kind != "model":
        log("no draft model: the adaptive and fallback suites use the layer-skip drafter")
    ks = [int(k) for k in a.ks.split(",") if k]
    specs = suites(ks, draft_kind)
    chosen = [s for s in a.suites.split(",") if s]
    unknown = set(chosen) - set(specs)
    if unknown:
        ap.error(f"unknown suite(s) {', '.join(sorted(unknown))}; choose from {', '.join(specs)}")
    log(f"[{pair.describe()}; {describe()}]")
    results = {name: run_suite(pair, name, specs[name], a.repeats, a.max_tokens, a.warmup_tokens, log)
               for name in chosen}
    head = headline(results, draft_kind)
    print(table(results))
    print()
    for k, v in head.items():
        print(f"{k}: {json.dumps(v) if not isinstance(v, float) else f'{v:.3f}'}")
    out = {
        "pair": pair.describe(), "backend": describe(), "machine": platform.platform(),
        "python": platform.python_version(), "mlxspec": mlxspec.__version__,
        "max_tokens": a.max_tokens, "repeats": a.repeats, "ks": ks,
        "wall_time_s": time.time() - t0, "headline": head, "suites": results,
    }
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    log(f"wrote {path} ({out['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()
