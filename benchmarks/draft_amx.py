"""The draft's forwards with its int8 products on AMX tiles and on VNNI, side by side.

    python benchmarks/draft_amx.py                    # widths 1, 2, 4, 8, 14; 15 timings each
    python benchmarks/draft_amx.py --widths 3,6 --timings 25

One process, the default pair's draft loaded once with its pruned head, compiled
forwards (as a tree level runs them) after a 300-token history; each timing is one
forward over w positions, its logits evaluated, the cache rolled back after it.  The
two settings alternate call by call (small_gemm.set_draft_amx), in a rotating order,
after two warm-up calls each.  Both compute the same integer sums (draft_gemm.c), so
the logits must be identical; the script checks it at every width.  Needs the pair
pulled and a CPU whose Linux grants AMX.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlxspec import api, small_gemm  # noqa: E402
from mlxspec.errors import MlxspecError  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="1,2,4,8,14")
    ap.add_argument("--timings", type=int, default=15)
    args = ap.parse_args()
    if small_gemm.set_draft_amx(True) is None:
        print("no AMX here (or Linux does not grant it): nothing to compare", file=sys.stderr)
        return 1
    try:
        pair = mlxspec.load()
    except MlxspecError as e:  # the pair not pulled, a broken folder: one line
        print(f"draft_amx: {e}", file=sys.stderr)
        return 2
    state = api.make_drafter(pair, "model").state
    state.prefill(list(range(1000, 1300)))

    def forward(w: int, amx: bool) -> tuple[float, np.ndarray]:
        small_gemm.set_draft_amx(amx)
        at = state.cache[0].offset
        x = mx.array([5] * w)
        t0 = time.perf_counter()
        out = state.compiled(x) if state.compiled is not None else state.model(x[None], cache=state.cache)[0]
        mx.eval(out)
        took = time.perf_counter() - t0
        for c in state.cache:
            c.offset = at
        return took, np.array(out)

    same = True
    try:
        for w in (int(x) for x in args.widths.split(",")):
            for amx in (True, False, True, False):
                forward(w, amx)
            times = {True: [], False: []}
            outs = {}
            for i in range(args.timings):
                for amx in ((True, False) if i % 2 else (False, True)):
                    t, outs[amx] = forward(w, amx)
                    times[amx].append(t)
            same &= bool(np.array_equal(outs[True], outs[False]))
            tiles, vnni = statistics.median(times[True]), statistics.median(times[False])
            print(f"draft forward over {w:2d} positions: VNNI {1e3 * vnni:5.1f} ms, AMX {1e3 * tiles:5.1f} ms "
                  f"(medians of {args.timings}): {vnni / tiles:.2f}x; logits identical: "
                  f"{np.array_equal(outs[True], outs[False])}")
    finally:
        small_gemm.set_draft_amx(True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
