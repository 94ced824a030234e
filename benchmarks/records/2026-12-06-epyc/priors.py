"""Priced rounds (benchmarks/priced_rounds.py's method) for variants of the draft-length acceptance priors, greedy:
    python priors.py code 64 base,w1,upper,mid-up
base: the shipped priors (each confidence bucket starts at its centre, weight 2); w1: weight 1; upper: the
bucket's upper edge; mid-up: halfway between.  Trees and chains per variant, priced by the pair's calibration;
also, for the shipped trees, each bucket's mean estimate against the share kept."""
import sys, collections
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import mlxspec
from mlxspec import draft_length
from mlxspec.api import encode_prompt, make_decoder, stream_generate
from priced_rounds import Widths, priced
import side_by_side

suite, maxt = sys.argv[1], int(sys.argv[2]); names = sys.argv[3].split(",")
BUCKETS = draft_length.BUCKETS
centers = [(lo + hi) / 2 for lo, hi in zip((0.0,) + BUCKETS, BUCKETS + (1.0,))]
uppers = list(BUCKETS) + [1.0]

def setprior(pol, vals, w=draft_length.PRIOR_WEIGHT):
    pol.kept = [v * w for v in vals] + [0.5 * w]
    pol.seen = [w] * (len(vals) + 1)

VARIANTS = {
  "base": lambda pol: None,
  "w1": lambda pol: setprior(pol, centers, 1.0),
  "upper": lambda pol: setprior(pol, uppers),
  "mid-up": lambda pol: setprior(pol, [(c + u) / 2 for c, u in zip(centers, uppers)]),
}
calib = collections.defaultdict(lambda: [0.0, 0.0, 0])
pair = mlxspec.load()
class A: pass
a = A(); a.suite = suite; a.prompts = "0"
prompts = side_by_side.chosen_prompts(a)
tot = collections.defaultdict(lambda: [0, 0.0, 0]); per = {}
for p in prompts:
    ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
    outs = []
    for v in names:
        for tree in (None, False):
            dec = make_decoder(pair, "model", "auto", 0.0, tree=tree)
            VARIANTS[v](dec.policy)
            if v == "base" and tree is None:
                pol = dec.policy; orig = pol.update
                def upd(rnd, outcomes, tokens=0, pol=pol, orig=orig):
                    for conf, kept in outcomes:
                        if conf != "refused" and conf is not None:
                            b = pol._bucket(conf); c = calib[b]; c[0] += pol.acceptance(conf); c[1] += kept; c[2] += 1
                    return orig(rnd, outcomes, tokens)
                pol.update = upd
            with Widths() as w:
                st = stream_generate(pair, ids, max_tokens=maxt, decoder=dec, temp=0.0, seed=0)
                outs.append([c.token for c in st if c.token >= 0])
            ver, dr = priced(dec, w.log)
            s = st.stats; lab = f"{v}/{'trees' if tree is None else 'chains'}"
            t = tot[lab]; t[0] += s.generated_tokens; t[1] += ver + dr; t[2] += s.target_passes
            per[(p['id'], lab)] = s.generated_tokens / (ver + dr)
            print(f"{p['id']:18s} {lab:14s} {s.generated_tokens/s.target_passes:.2f} tok/pass {s.generated_tokens/(ver+dr):.3f}x", flush=True)
    assert all(o == outs[0] for o in outs), "OUTPUTS DIFFER"
for lab, (n, c, ps) in tot.items():
    print(f"ALL {lab:14s} {n/ps:.2f} tok/pass {n/c:.3f}x")
import statistics
for lab in tot:
    print(f"MEDIAN {lab:14s} {statistics.median(per[(p['id'], lab)] for p in prompts):.3f}x")
for b in sorted(calib):
    e, k, n = calib[b]; print(f"bucket {b:2d} n={n:3d} est {e/n:.3f} kept {k/n:.3f}")
