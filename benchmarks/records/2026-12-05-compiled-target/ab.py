"""The target's forwards compiled too (compiled_forward.attach on the decoder's target state), against
the shipped uncompiled target: plain decoding and the default (trees) each way, and mlx-lm k=3, one
process, interleaved, warm, in a rotating order per repeat, greedy; outputs must be identical (a
compiled verify pass scores each position bit for bit as a compiled plain step does).

    python benchmarks/records/2026-12-05-compiled-target/ab.py --prompts 0 --repeats 3 --out F.json
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT)), sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, contender_comparison  # noqa: E402

import mlxspec  # noqa: E402
from mlxspec import compiled_forward  # noqa: E402
from mlxspec.bench_contenders import MlxspecContender, make_contender  # noqa: E402


class CompiledTarget(MlxspecContender):
    def decoder(self, pair):
        dec = super().decoder(pair)
        assert compiled_forward.attach(dec.target), compiled_forward.unusable(dec.target)
        return dec


compiled_forward.KEPT = 8  # the draft's and the target's functions, two capacities each
args = arguments(__doc__, "0", 64, "compiled-target.json")
pair = mlxspec.load()
contenders = {"plain": make_contender("plain"), "plain ct": CompiledTarget("plain ct", drafter="none", num_draft=0),
              "trees": make_contender("model:auto"), "trees ct": CompiledTarget("trees ct", num_draft="auto"),
              "mlx-lm k=3": make_contender("mlx-lm:3")}
sys.exit(contender_comparison(args, pair, contenders, [
    "plain ct / plain", "trees ct / trees", "trees / mlx-lm k=3", "trees ct / mlx-lm k=3", "trees / plain",
    "trees ct / plain ct"]))
