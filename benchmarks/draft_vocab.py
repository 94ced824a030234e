"""The draft head's vocabulary subset (FR-Spec): acceptance and draft-step cost by N.

    python benchmarks/draft_vocab.py                      # the default pair, code suite prompts
    python benchmarks/draft_vocab.py --sizes full,32768,16384,8192 --max-tokens 48

For each N, one process, interleaved: the draft step's cost relative to a plain
target step (the calibration's own measurement: minimum over repeats, after a
warm-up) and, at a fixed k (so acceptance is comparable across N), greedy
acceptance, tokens per target pass and decode speed on the suite's prompts, all
outputs checked identical to plain decoding.  Writes a table and --out JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import mlxspec
from mlxspec.costs import calibration as calibration_cache, cost_model
from mlxspec.api import make_decoder, make_drafter
from mlxspec.commands.bench import encode, load_suite, select_prompts
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.stats import GenerationStats


def run(pair, ids, drafter, num_draft, vocab, max_tokens):
    dec = make_decoder(pair, drafter, num_draft, draft_vocab=vocab)
    stats = GenerationStats()
    toks = [t for t, _ in dec.generate(list(ids), SamplingParams(), max_tokens, (), stats)]
    return toks, stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model"), ap.add_argument("--draft")
    ap.add_argument("--sizes", default="full,65536,32768,16384,8192")
    ap.add_argument("--suite", default="code")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="bench-results/draft-vocab.json")
    a = ap.parse_args(argv)
    pair = mlxspec.load(a.model, a.draft)
    sizes = [s if s == "full" else int(s) for s in a.sizes.split(",")]
    prompts = select_prompts([load_suite(a.suite)], a.prompts)
    ids = [encode(pair.tokenizer, p) for p in prompts]
    rows = {s: {"size": s, "draft_step": [], "accepted": 0, "proposed": 0, "passes": 0, "tokens": 0, "tps": []}
            for s in sizes}
    for s in sizes:  # warm-up and the calibration (its own warm-up, interleaved widths, minimum of repeats)
        d = make_drafter(pair, "model", 0.0, s)
        rows[s]["draft_step"].append(calibration_cache.for_decoder(pair, d, refresh=True).draft_step)
    plain = {i: run(pair, x, "none", 0, None, a.max_tokens)[0] for i, x in enumerate(ids)}
    for rep in range(a.repeats):
        order = sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]
        for i, x in enumerate(ids):
            for s in order:
                toks, st = run(pair, x, "model", a.k, s, a.max_tokens)
                assert toks == plain[i], f"N={s}: output differs from plain decoding on prompt {i}"
                r = rows[s]
                r["accepted"] += st.draft_accepted
                r["proposed"] += st.draft_proposed
                r["passes"] += st.target_passes
                r["tokens"] += st.generated_tokens
                r["tps"].append(st.generation_tps)
        for s in sizes:
            d = make_drafter(pair, "model", 0.0, s)
            vocab = calibration_cache._vocab_rows(pair)
            rows[s]["draft_step"].append(cost_model.calibrate(pair.target, d, vocab).draft_step)
    print(f"{pair.describe()}; k={a.k}; {len(ids)} prompts x {a.repeats} repeats x {a.max_tokens} tokens, greedy")
    print("| N | draft step (plain steps) | acceptance | tokens/pass | tok/s (median) |")
    print("|---|---|---|---|---|")
    for s in sizes:
        r = rows[s]
        ds = r["draft_step"]
        r["acceptance"] = r["accepted"] / max(r["proposed"], 1)
        r["tokens_per_pass"] = r["tokens"] / max(r["passes"], 1)
        print(f"| {s} | {statistics.median(ds):.3f} ({min(ds):.3f}-{max(ds):.3f}) | {100 * r['acceptance']:.1f}% "
              f"| {r['tokens_per_pass']:.2f} | {statistics.median(r['tps']):.2f} ({min(r['tps']):.2f}-{max(r['tps']):.2f}) |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pair": pair.describe(), "k": a.k, "max_tokens": a.max_tokens, "rows": list(rows.values()),
                               "time": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
