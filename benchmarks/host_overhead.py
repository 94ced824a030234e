"""The loop's host time: what a round costs beyond its models' arithmetic (issue 60).

    python benchmarks/host_overhead.py                 # 4 repeats, 150 tokens each
    python benchmarks/host_overhead.py --repeats 8 --json host.json

A Mac pays the loop's Python, its MLX graph building and the synchronisations of each
round (the draft's per-token decisions read each draft token back) as much as this
machine does; on Apple silicon a 7B 4-bit step is ~10 ms and a 1.5B one ~3.5 ms, so a
millisecond of host time per round is a tenth to a third of a target step.  To measure
it without the models' arithmetic, the loop runs real rounds on a tiny model (2 layers,
64 wide, 300 tokens: its forwards cost next to nothing), with chains of every k from 0
to 8 and with wide token trees (free widths, so trees of up to 32 nodes), and times each
round (from one round's end to the next).  A least-squares fit over every round,

    round_ms = base + forwards * per_forward + positions * per_position

(forwards: the draft's forwards plus the target's pass; positions: drafted tokens
verified), gives the host cost of a forward and of a verified position (a tree node's
Python: growing, masking, walking).  `base` is a plain round's host time, which the
unit of the cost model -- one plain step of the loop -- already holds.  The figures are
an upper estimate for a Mac: the CPU backend here also executes each tiny operation on
the host (Metal encodes it and returns), and Apple's cores run Python at least as fast.
docs/profiles.md turns them into the profiles' `host_overhead` (per forward) and
`host_per_position`, in target steps of each profile's Mac.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import mlxspec  # noqa: E402,F401  (sets up the MLX backend first)
import numpy as np  # noqa: E402

import tiny_models  # noqa: E402
from mlxspec.core.stats import GenerationStats  # noqa: E402
from mlxspec.costs.cost_model import assumed  # noqa: E402
from mlxspec.costs.draft_length import FixedK, PerToken  # noqa: E402
from mlxspec.decoder import SpeculativeDecoder  # noqa: E402
from mlxspec.drafting.drafters import ModelDrafter  # noqa: E402

PROMPT = [7, 19, 200, 31, 31, 5, 17, 99]


def rounds_of(target, draft, policy, tree: bool, tokens: int, repeats: int) -> list[tuple[float, int, int]]:
    """(ms, forwards, positions) of every round after the first generation (a warm-up)."""
    out = []
    dec = SpeculativeDecoder(target, ModelDrafter(draft), policy, tree=tree)
    for rep in range(repeats + 1):
        st = GenerationStats()
        st.rounds = []
        marks = []
        record = st.record_round

        def timed(*a, **k):
            marks.append(time.perf_counter())
            return record(*a, **k)

        st.record_round = timed
        t0 = time.perf_counter()
        for _ in dec.generate(list(PROMPT), max_tokens=tokens, stats=st):
            pass
        if rep == 0:
            continue
        starts = [t0] + marks[:-1]
        for (dw, vw, _), a, b in zip(st.rounds, starts, marks):
            out.append(((b - a) * 1000, len(dw) + 1, vw - 1))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cfg = tiny_models.config_for("qwen2")
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.02, seed=1)
    rows = []
    for k in range(0, 9):
        rows += rounds_of(target, draft, FixedK(k), False, a.tokens, a.repeats)
    rows += rounds_of(target, draft, PerToken(assumed(0.05, slope=0.0, width=40), 8), True, a.tokens, a.repeats)
    ms = np.array([r[0] for r in rows])
    x = np.array([[1.0, r[1], r[2]] for r in rows])
    # the median of each (forwards, positions) cell, so that a spell of load on a shared machine
    # weighs as one point, not as many rounds
    cells = {}
    for m, f, p in rows:
        cells.setdefault((f, p), []).append(m)
    keys = sorted(cells)
    y = np.array([statistics.median(cells[c]) for c in keys])
    xc = np.array([[1.0, f, p] for f, p in keys])
    w = np.sqrt(np.array([len(cells[c]) for c in keys], dtype=float))
    (base, per_forward, per_position), *_ = np.linalg.lstsq(xc * w[:, None], y * w, rcond=None)
    plain = statistics.median(m for m, f, p in rows if f == 1)
    fit = xc @ np.array([base, per_forward, per_position])
    print(f"rounds: {len(rows)} in {len(keys)} (forwards, positions) cells; plain round median {plain:.2f} ms")
    print(f"fit: round_ms = {base:.2f} + {per_forward:.3f} x forwards + {per_position:.3f} x positions "
          f"(cells' median residual {statistics.median(abs(y - fit)):.2f} ms)")
    for (f, p), v, e in zip(keys, y, fit):
        print(f"  forwards {f:2d} positions {p:2d}: {v:7.2f} ms measured, {e:7.2f} fitted, {len(cells[(f, p)])} rounds")
    if a.json:
        Path(a.json).write_text(json.dumps({"base_ms": base, "per_forward_ms": per_forward,
                                            "per_position_ms": per_position, "plain_round_ms": plain,
                                            "cells": [[f, p, v, len(cells[(f, p)])] for (f, p), v in zip(keys, y)]}))


if __name__ == "__main__":
    main()
