"""Priced rounds (priced_rounds.py's method, the pair's calibration): trees, trees without prompt lookup's
branches (round_phases.NoLookup), chains; a fresh decoder per generation, as bench.  python lookup_priced.py code 64"""
import sys, collections, statistics
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import mlxspec
from mlxspec.api import encode_prompt, make_decoder, stream_generate
from priced_rounds import Widths, priced
from round_phases import NoLookup
import side_by_side
suite, maxt = sys.argv[1], int(sys.argv[2])
pair = mlxspec.load()
class A: pass
a = A(); a.suite = suite; a.prompts = "0"
tot = collections.defaultdict(lambda: [0, 0.0, 0]); per = {}
prompts = side_by_side.chosen_prompts(a)
for p in prompts:
    ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True); outs = []
    for lab in ("trees", "trees-nolookup", "chains"):
        dec = make_decoder(pair, "model", "auto", 0.0, tree=False if lab == "chains" else None)
        if lab == "trees-nolookup": dec.lookup = NoLookup()
        with Widths() as w:
            st = stream_generate(pair, ids, max_tokens=maxt, decoder=dec, temp=0.0, seed=0)
            outs.append([c.token for c in st if c.token >= 0])
        ver, dr = priced(dec, w.log); s = st.stats
        t = tot[lab]; t[0] += s.generated_tokens; t[1] += ver + dr; t[2] += s.target_passes
        per[(p['id'], lab)] = s.generated_tokens / (ver + dr)
        print(f"{p['id']:18s} {lab:15s} passes {s.target_passes:3d} {s.generated_tokens/s.target_passes:.2f} tok/pass verify {ver:.1f} draft {dr:.1f} -> {per[(p['id'], lab)]:.3f}x", flush=True)
    assert all(o == outs[0] for o in outs), "OUTPUTS DIFFER"
for lab, (n, c, ps) in tot.items():
    print(f"ALL {lab:15s} {n/ps:.2f} tok/pass {n/c:.3f}x median {statistics.median(per[(p['id'], lab)] for p in prompts):.3f}x")
