import os, sys, runpy
from pathlib import Path; ROOT = Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import mlxspec
from mlxspec import draft_length, tree_budget
G = float(os.environ.get("GAMMA", "1"))
orig = draft_length.bar
def bar(t, e, rate):
    rt, re = orig(t, e, rate)
    return rt, re * G
draft_length.bar = bar; tree_budget.bar = bar
osel = tree_budget.TreeBudget.select
def select(self, values):
    r = self.rate
    cm, e = self.cost, [1.0]
    for v in values: e.append(e[-1] + v)
    t = [self.draft + cm.verify_width(m + 1) for m in range(len(e))]
    b = max(x / y for x, y in zip(e, t))
    if self.rate is not None: b = min(b, self.rate)
    b *= G
    return max(range(len(e)), key=lambda m: (e[m] - b * t[m], m))
tree_budget.TreeBudget.select = select
sys.argv = ["priced_rounds.py"] + sys.argv[1:]
runpy.run_path(str(ROOT / "benchmarks" / "priced_rounds.py"), run_name="__main__")
