"""Plain against speculative decoding with the target sharded over mlx.launch's ranks (issue 62).

    mlx.launch --backend ring -n 2 -- .venv/bin/python benchmarks/distributed.py   # sharded (2 ranks)
    .venv/bin/python benchmarks/distributed.py                                       # the same, one process

Greedy, a fixed draft length (--num-draft, chains: no calibration, so both sides decode alike
on every run), --tokens per run after one warm-up of each; --repeats interleaved pairs of
(plain, speculative), the order alternating.  Rank 0 prints one JSON line: tokens/s of every
run, the ratio of each pair, and per generated token the collectives and bytes exchanged --
rank 0's messages (distributed/channel.py) and the sharded forwards' own all_sums, counted
where they are built (each rank's contribution; a ring all_sum moves about twice that over
the wire per rank)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlxspec  # first: it sets up MLX's kernel cache (mlxspec/__init__.py)
import mlx.core as mx
from mlxspec.api import make_decoder
from mlxspec.distributed import from_launch

PROMPT = "Write a Python function that merges two sorted lists into one sorted list, with a docstring and tests."

counted = {"calls": 0, "bytes": 0}


def count_collectives():
    """Count every collective built from now on (the sharded layers call mx.distributed.all_sum)."""
    for name in ("all_sum", "all_gather", "send", "recv"):
        real = getattr(mx.distributed, name, None)
        if real is None:
            continue

        def counting(x, *a, _real=real, **k):
            counted["calls"] += 1
            counted["bytes"] += x.size * x.itemsize if hasattr(x, "itemsize") else 0
            return _real(x, *a, **k)

        setattr(mx.distributed, name, counting)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-draft", type=int, default=4)
    ap.add_argument("--pipeline", action="store_true")
    args = ap.parse_args()
    shard = from_launch(args.pipeline)
    pair = mlxspec.load(args.target, args.draft, shard=shard)
    if shard is not None and shard.rank:
        shard.follow(pair.target)
        return
    count_collectives()
    decoders = {"plain": make_decoder(pair, num_draft=0), "speculative": make_decoder(pair, num_draft=args.num_draft,
                                                                                     tree=False)}
    runs = {k: [] for k in decoders}

    def run(kind, keep=True, tokens=args.tokens):
        dec = decoders[kind]
        dec.reset()
        before = (counted["calls"], counted["bytes"], *(shard.channel.stats().values() if shard else (0, 0)))
        t0 = time.perf_counter()
        out = mlxspec.generate(pair, PROMPT, max_tokens=tokens, decoder=dec)
        dt = time.perf_counter() - t0
        after = (counted["calls"], counted["bytes"], *(shard.channel.stats().values() if shard else (0, 0)))
        calls, nbytes, msgs, mbytes = (a - b for a, b in zip(after, before))
        n = len(out.tokens)
        rec = {"tokens": n, "seconds": round(dt, 3), "tok_s": round(out.stats.generated_tokens / out.stats.generation_time, 2),
               "collectives_per_token": round(calls / n, 2), "bytes_per_token": round(nbytes / n),
               "messages_per_token": round(msgs / n, 2), "message_bytes_per_token": round(mbytes / n),
               "accepted": out.stats.draft_accepted, "proposed": out.stats.draft_proposed, "target_passes": out.stats.target_passes,
               "text_head": out.text[:60]}
        if keep:
            runs[kind].append(rec)
        return out.tokens

    run("plain", keep=False, tokens=8)  # warm-up
    run("speculative", keep=False, tokens=8)
    for rep in range(args.repeats):
        for kind in (("plain", "speculative") if rep % 2 == 0 else ("speculative", "plain")):
            run(kind)
    ratios = [s["tok_s"] / p["tok_s"] for p, s in zip(runs["plain"], runs["speculative"])]
    same = len({r["text_head"] for r in runs["plain"] + runs["speculative"]}) == 1  # greedy: the same text
    print(json.dumps({"mode": shard.mode if shard else "single process", "same_tokens": same,
                      "ratio_median": round(statistics.median(ratios), 3),
                      "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                      "runs": runs, "pair": pair.describe(), "num_draft": args.num_draft}), flush=True)


if __name__ == "__main__":
    main()
