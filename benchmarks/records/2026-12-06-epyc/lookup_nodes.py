"""Per code prompt, greedy, 64 tokens, the default (trees): how many tree nodes were lookup (spine) tokens and
siblings, how many were taken, and the lookup's mean acceptance estimate at the end.  python lookup_nodes.py code"""
import sys, collections
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import mlxspec
from mlxspec import tree_drafter
from mlxspec.api import encode_prompt, make_decoder, stream_generate
import side_by_side
cnt = collections.Counter()
init = tree_drafter.TreeDraft.__init__
def patched(self, *a, **k):
    init(self, *a, **k)
    t = self.tree
    cnt["rounds"] += 1; cnt["nodes"] += len(t.tokens); cnt["lookup nodes"] += sum(bool(x) for x in t.lookup)
    cnt["lookup first-level"] += sum(bool(t.lookup[i]) for i in range(len(t.tokens)) if t.parents[i] == -1)
    cnt["sibling nodes"] += sum(1 for i in range(len(t.tokens)) if t.rank[i] > 0 and not t.lookup[i])
tree_drafter.TreeDraft.__init__ = patched
pair = mlxspec.load()
class A: pass
for suite in sys.argv[1].split(","):
  a = A(); a.suite = suite; a.prompts = "0"
  for p in side_by_side.chosen_prompts(a):
    cnt.clear()
    ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
    dec = make_decoder(pair, "model", "auto", 0.0)
    st = stream_generate(pair, ids, max_tokens=64, decoder=dec, temp=0.0, seed=0); list(st)
    s = st.stats
    print(f"{p['id']:18s} passes {s.target_passes} {dict(cnt)} lookup_taken {s.tree_lookup_taken} siblings_taken {s.tree_siblings_taken} lookup mean {dec.policy.mean_acceptance(True):.2f}", flush=True)
