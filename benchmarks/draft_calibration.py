"""How often the target keeps a draft token of a given confidence (the draft's calibration).

    python benchmarks/draft_calibration.py --temp 0.7 --seeds 0,100          # code, chat, creative
    python benchmarks/draft_calibration.py --temp 0 --profile apple-m1-7b --suites chat

The per-token policy (costs/draft_length.py) prices a drafted token at the acceptance seen
for drafts of its confidence (the draft's top probability there), starting from a prior
(costs/confidence.py: acceptance = confidence greedy; at T > 0 the curve this measured).
This runs the default (`auto`, trees) on every prompt of each suite, deciding by
`--profile` (apple-m3plus-7b by default: deep rounds, so many outcomes), and tallies
every draft outcome the policy is told of -- (confidence, kept) for each draft up to
and including a path's first rejected one -- by confidence band.  Counts only, no
clock: the same command gives the same table.  Lookup proposals (no confidence) are left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.api import make_decoder, stream_generate  # noqa: E402
from mlxspec.bench.prompts import encode, load_suite  # noqa: E402

BANDS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0)


def record(policy) -> list:
    """Wrap `policy.update` so that every draft outcome it is told of -- (confidence, kept),
    lookup proposals and refusals left out -- lands in the list returned."""
    seen, update = [], policy.update

    def recording(rnd, outcomes, tokens=0):
        seen.extend((float(c), bool(k)) for c, k in outcomes if c is not None and not isinstance(c, str))
        return update(rnd, outcomes, tokens)

    policy.update = recording
    return seen


def bands(seen: list) -> list:
    """(low, high, outcomes, mean confidence, share kept) for each confidence band with outcomes."""
    out = []
    for lo, hi in zip(BANDS, BANDS[1:]):
        band = [(c, k) for c, k in seen if lo <= c < hi or (hi == BANDS[-1] and c == hi)]
        if band:
            out.append((lo, hi, len(band), sum(c for c, _ in band) / len(band), sum(k for _, k in band) / len(band)))
    return out


def outcomes_of(pair, ids, profile: str, temp: float, seed: int, max_tokens: int) -> list:
    """(confidence, kept) of every draft outcome one generation reports to its policy."""
    dec = make_decoder(pair, "model", None, cost_profile=profile)
    seen = record(dec.policy)
    kw = dict(temp=temp) if temp == 0 else dict(temp=temp, seed=seed, sampling="rejection")
    for _ in stream_generate(pair, ids, max_tokens=max_tokens, decoder=dec, **kw):
        pass
    return seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--suites", default="code,chat,creative")
    ap.add_argument("--profile", default="apple-m3plus-7b")
    ap.add_argument("--temp", type=float, default=0.7)
    ap.add_argument("--seeds", default="0", help="at T > 0: one run per prompt and seed (seed + prompt index)")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    pair = mlxspec.load(a.model, a.draft)
    seeds = [int(s) for s in a.seeds.split(",")] if a.temp else [0]
    print(f"{a.profile}, T={a.temp:g}: kept / outcomes by the draft's confidence")
    for name in a.suites.split(","):
        seen = []
        for i, prompt in enumerate(load_suite(name).prompts):
            for seed in seeds:
                seen += outcomes_of(pair, encode(pair.tokenizer, prompt), a.profile, a.temp, seed + i, a.max_tokens)
        print(f"{name}: {len(seen)} outcomes")
        for lo, hi, n, conf, kept in bands(seen):
            print(f"  [{lo:.2f}, {hi:.2f}{']' if hi == BANDS[-1] else ')'}  n={n:4d}  "
                  f"mean confidence {conf:.3f}  kept {kept:.3f}")

if __name__ == "__main__":
    main()
