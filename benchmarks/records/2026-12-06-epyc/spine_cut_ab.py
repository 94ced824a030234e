"""Timed A/B, one process, interleaved (order alternating per repeat), warm: trees as shipped against trees whose
lookup spine stops at the first token the draft disagrees with.  Decode time after the first token."""
import sys, time, statistics, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import spine_cut as spine  # the patch (MODE), imported without running its main
import mlxspec
from mlxspec.api import encode_prompt, make_decoder, stream_generate
import side_by_side
pair = mlxspec.load()
class A: pass
a = A(); a.suite = "code"; a.prompts = "0"
prompts = side_by_side.chosen_prompts(a)
def run(ids, lab):
    spine.MODE["cut"] = lab == "cut"
    dec = make_decoder(pair, "model", "auto", 0.0)
    st = stream_generate(pair, ids, max_tokens=64, decoder=dec, temp=0.0, seed=0)
    toks, t1 = [], None
    for c in st:
        if c.token >= 0:
            toks.append(c.token)
            if t1 is None: t1 = time.perf_counter()
    return toks, (len(toks) - 1) / (time.perf_counter() - t1)
ratios = collections.defaultdict(list)
for p in prompts:
    ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
    run(ids, "shipped")  # warm
    for r in range(3):
        order = ("shipped", "cut") if r % 2 == 0 else ("cut", "shipped")
        res = {lab: run(ids, lab) for lab in order}
        assert res["cut"][0] == res["shipped"][0]
        ratios[p["id"]].append(res["cut"][1] / res["shipped"][1])
        print(f"{p['id']:16s} #{r} shipped {res['shipped'][1]:.2f} tok/s cut {res['cut'][1]:.2f} tok/s ratio {ratios[p['id']][-1]:.3f}", flush=True)
meds = {k: statistics.median(v) for k, v in ratios.items()}
allr = [x for v in ratios.values() for x in v]
print("per prompt median cut/shipped:", {k: round(v, 3) for k, v in meds.items()})
print(f"median of prompt medians {statistics.median(meds.values()):.3f}; pairs median {statistics.median(allr):.3f} ({min(allr):.3f}-{max(allr):.3f}), n={len(allr)}; outputs identical")
