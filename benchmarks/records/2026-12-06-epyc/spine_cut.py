"""Priced rounds (priced_rounds.py's method, idle calibration), code / chat / creative, greedy: trees as shipped vs trees whose lookup spine stops at the first token the draft disagrees with."""
import sys, collections, statistics
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import mlxspec
from mlxspec import tree_drafter
from mlxspec.api import encode_prompt, make_decoder, stream_generate
from priced_rounds import Widths, priced
import side_by_side
orig = tree_drafter.TreeDraft._add_spine
MODE = {"cut": False}
def add_spine(self, parent, spine, spine_rows, fed_start, grown):
    if MODE["cut"] and spine:
        nodes, values, rows = grown
        row = rows[nodes.index(parent)]
        n = 0
        for i, tok in enumerate(spine):
            if row[3] != tok: break
            n += 1; row = spine_rows[i]
        spine = spine[:n]
    return orig(self, parent, spine, spine_rows, fed_start, grown)
tree_drafter.TreeDraft._add_spine = add_spine
def main():
    pair = mlxspec.load()
    class A: pass
    for suite, maxt in (("code", 64), ("chat", 48), ("creative", 48)):
        a = A(); a.suite = suite; a.prompts = "0"
        tot = collections.defaultdict(lambda: [0, 0.0, 0]); per = {}
        prompts = side_by_side.chosen_prompts(a)
        for p in prompts:
            ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True); outs = []
            for lab in ("shipped", "cut"):
                MODE["cut"] = lab == "cut"
                dec = make_decoder(pair, "model", "auto", 0.0)
                with Widths() as w:
                    st = stream_generate(pair, ids, max_tokens=maxt, decoder=dec, temp=0.0, seed=0)
                    outs.append([c.token for c in st if c.token >= 0])
                ver, dr = priced(dec, w.log); s = st.stats
                t = tot[lab]; t[0] += s.generated_tokens; t[1] += ver + dr; t[2] += s.target_passes
                per[(p['id'], lab)] = s.generated_tokens / (ver + dr)
                print(f"{p['id']:18s} {lab:8s} passes {s.target_passes:3d} -> {per[(p['id'], lab)]:.3f}x", flush=True)
            assert outs[0] == outs[1]
        for lab, (n, c, ps) in tot.items():
            print(f"{suite} ALL {lab:8s} {n/ps:.2f} tok/pass {n/c:.3f}x median {statistics.median(per[(p['id'], lab)] for p in prompts):.3f}x", flush=True)

if __name__ == '__main__':
    main()
