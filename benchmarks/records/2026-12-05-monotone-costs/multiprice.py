"""Greedy generations decided by each --decide calibration and priced by each --prices one (priced_rounds.py's
method; the decisions are recorded once and priced many ways).  Files are read as they are, not made monotone
(this ran before monotone_costs.py; the monotone curve was given as its own file).  From the repository root:

    python benchmarks/records/2026-12-05-monotone-costs/multiprice.py --suite chat --prompts 0 --max-tokens 64 \
        --contenders trees,chains --decide A.json --decide B.json --prices C.json --prices D.json
"""
import json, sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
import mlxspec
from mlxspec.api import encode_prompt, make_decoder, stream_generate
import priced_rounds as pr
from side_by_side import arguments, chosen_prompts
def opts(ap):
    pr.options(ap)
    ap.add_argument("--prices", type=Path, action="append", default=[])
args = arguments(__doc__, "0", 64, "mp.json", repeats=1, extra=opts)
names = args.contenders.split(",")
from mlxspec import cost_model
raw = lambda p: cost_model.read(p, fmt=None)
deciders = {p.stem: raw(p) for p in args.decide} or {"own": None}
prices = {p.stem: raw(p) for p in args.prices}
pair = mlxspec.load()
tot = {}
for p in chosen_prompts(args):
    ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
    outs = []
    for dn, cm in deciders.items():
        for name in names:
            tree, rb = pr.CONTENDERS[name]
            dec = make_decoder(pair, "model", "auto", 0.0, tree=tree)
            if cm is not None: dec.policy.cost = cm
            with pr.Widths() as w:
                st = stream_generate(pair, ids, max_tokens=args.max_tokens, decoder=dec, temp=0.0, seed=0)
                outs.append([c.token for c in st if c.token >= 0])
            n = st.stats.generated_tokens
            line = f"{p['id'][:14]:14s} {name:6s} by {dn:10s} passes {st.stats.target_passes:3d}"
            for pn, pc in prices.items():
                v, d = pr.priced(dec, w.log, pc)
                t = tot.setdefault((name, dn, pn), [0, 0.0, 0])
                t[0] += n; t[1] += v + d; t[2] += st.stats.target_passes
                line += f" | {pn} {n/(v+d):.3f}"
            print(line, flush=True)
    assert all(o == outs[0] for o in outs), "outputs differ"
for (name, dn, pn), (n, t, ps) in sorted(tot.items()):
    print(f"{args.suite} {name:6s} decided by {dn:10s} priced by {pn:12s}: {n/t:.3f}x  {n/ps:.2f} tok/pass")
