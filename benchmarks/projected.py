"""Projected speed-ups on Apple silicon, from real runs here, without a clock (issue 60).

    python benchmarks/projected.py                                  # code, chat, creative; T=0 and 0.7; 4 profiles
    python benchmarks/projected.py --suites code --temps 0 --profiles apple-m3plus-7b --out proj.json
    python benchmarks/projected.py --suites code --profiles this-machine     # priced by this machine's calibration

One process, the default pair loaded once.  For each prompt and temperature, mlx-lm's own
speculative decoding (k=3) runs once (its work does not depend on a profile), and
mlxspec's default (`num_draft=auto`, trees) runs once per profile, deciding by that
profile's costs (`cost_profile=`).  Every run's work -- `stats.rounds` for mlxspec,
mlx-lm's rounds rebuilt from its from_draft flags (bench/projection.mlxlm_work) -- is
priced by the profile (costs/profiles.price), as `mlxspec bench --profile` prices it,
and a run's projected speed-up is its tokens (and the EOS, where it stopped there)
over their price, plain decoding costing one step a token.  Medians over prompts.

Greedy outputs must equal plain decoding's (checked against mlx-lm's, which is the
target's argmax too, modulo near-ties).  At T > 0 mlxspec samples by rejection (the
default without a seed; `--sampling coupled`: the same text whatever drafts, so runs that decide
differently compare on one text) with seed + prompt index; mlx-lm with the same seed.  Work
counts are deterministic: no timing noise enters these figures; what they rest on is
the profile (docs/profiles.md) and this pair's acceptance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.api import make_decoder, stream_generate  # noqa: E402
from mlxspec.bench.contenders import MlxLmContender  # noqa: E402
from mlxspec.bench.projection import mlxlm_work  # noqa: E402
from mlxspec.bench.prompts import encode, load_suite, select_prompts  # noqa: E402
from mlxspec.costs.profiles import load_profile, price  # noqa: E402

PROFILES = "apple-m3plus-7b,apple-m3plus-32b,apple-m3plus-1.5b,apple-m1-7b"


def speedup(rounds, cm, stopped: bool) -> float:
    tokens, cost = price(rounds, cm)
    return (tokens + stopped) / cost


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--suites", default="code,chat,creative")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per suite (the first N)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sampling", choices=("rejection", "coupled"), default="rejection",
                    help="mlxspec's sampling at T > 0 (coupled: the same text whatever drafts, core/coupled.py)")
    ap.add_argument("--profiles", default=PROFILES)
    ap.add_argument("--out", default=None, help="write every run's figures (and its rounds' work) as JSON here")
    a = ap.parse_args(argv)

    pair = mlxspec.load(a.model, a.draft)
    profiles = {name: load_profile(name) for name in a.profiles.split(",")}
    prompts = select_prompts([load_suite(s) for s in a.suites.split(",")], a.prompts)
    temps = [float(t) for t in a.temps.split(",")]
    mlxlm = MlxLmContender("mlx-lm k=3", 3)
    runs = []
    for temp in temps:
        for i, prompt in enumerate(prompts):
            ids = encode(pair.tokenizer, prompt)
            seed = a.seed + i
            ref = mlxlm.run(pair, ids, temp=temp, max_tokens=a.max_tokens, seed=seed)
            ref_work = mlxlm_work(ref.from_draft, 3, a.max_tokens)
            for name, prof in profiles.items():
                dec = make_decoder(pair, "model", None, cost_profile=name)
                kw = dict(temp=temp) if temp == 0 else dict(temp=temp, seed=seed, sampling=a.sampling)
                stream = stream_generate(pair, ids, max_tokens=a.max_tokens, decoder=dec, **kw)
                stream.stats.rounds = []
                tokens = [c.token for c in stream if c.token >= 0]
                st = stream.stats
                # mlx-lm's draft is the pair's draft model (this-machine: the calibration mlxspec decides by)
                cm_draft = dec.policy.cost if prof is None else prof.cost_model(dec.drafter)
                tree = st.tree_summary or {}
                row = {
                    "temp": temp, "suite": prompt.suite, "prompt": prompt.key, "profile": name,
                    "tokens": len(tokens), "finish": st.finish_reason,
                    "default_x_plain": speedup(st.rounds, dec.policy.cost, st.finish_reason == "stop"),
                    "mlxlm_x_plain": speedup(ref_work, cm_draft, ref.finish_reason == "stop"),
                    "tokens_per_pass": st.tokens_per_pass, "acceptance": st.acceptance_rate,
                    "plain_rounds": sum(1 for r in st.rounds if not r[0]), "rounds": len(st.rounds),
                    "tree_nodes": tree.get("mean_nodes", 0.0), "tree_depth": tree.get("mean_depth", 0.0),
                    "tree_rounds": tree.get("rounds", 0),
                    "same_as_mlxlm": tokens == ref.tokens if temp == 0 else None,
                    "near_ties": st.near_ties,
                    "rounds_work": [list(r) for r in st.rounds] if a.out else None,
                    "mlxlm_work": [list(r) for r in ref_work] if a.out else None,
                }
                runs.append(row)
                print(f"T={temp:g} {prompt.key} {name}: default {row['default_x_plain']:.2f}x "
                      f"mlx-lm {row['mlxlm_x_plain']:.2f}x  tok/pass {row['tokens_per_pass']:.2f} "
                      f"trees {row['tree_nodes']:.1f}/{row['tree_depth']:.1f} "
                      f"plain rounds {row['plain_rounds']}/{row['rounds']}"
                      + ("" if temp else f" same={row['same_as_mlxlm']} ties={row['near_ties']}"), flush=True)
    print()
    head = f"{'profile':18} {'T':>4} {'suite':9} {'default':>8} {'mlx-lm':>7} {'ratio':>6} {'tok/pass':>8} {'tree n/d':>9}"
    print(head)
    print("-" * len(head))
    for name in profiles:
        for temp in temps:
            for suite in list(dict.fromkeys(r["suite"] for r in runs)):
                rs = [r for r in runs if r["profile"] == name and r["temp"] == temp and r["suite"] == suite]
                med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
                d, m = med("default_x_plain"), med("mlxlm_x_plain")
                print(f"{name:18} {temp:4g} {suite:9} {d:7.2f}x {m:6.2f}x {d / m:5.2f}x {med('tokens_per_pass'):8.2f} "
                      f"{med('tree_nodes'):4.1f}/{med('tree_depth'):<4.1f}")
    if a.out:
        Path(a.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
