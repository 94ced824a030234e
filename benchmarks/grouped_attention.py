"""Attention with the query heads that share a key head scored by one product, and with a
product per head, side by side (lean_attention.heads_per_product).

    python benchmarks/grouped_attention.py                          # contexts of 100 and 1500 tokens
    python benchmarks/grouped_attention.py --contexts 300 --repeats 6

One process, the default pair loaded once.  For each context length, the draft (its
compiled forward, as the loop runs it) and the target each hold that many tokens; each
timing is one forward over w positions with its logits evaluated, the caches rolled back
after it (ModelState.sync).  The two settings alternate by repeat, in a rotating order;
each switch retraces the compiled draft (excluded: two warm-up calls).  Widths: the draft
over 1 and 4 positions (a chain step, a tree level), the target over 1, 5 and 8 (a plain
step, verify passes).  Both settings compute the same sums, so every forward's argmax must
be the same; the script checks it.  Needs the pair pulled.
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
from mlxspec import blas_layout, compiled_forward, lean_attention  # noqa: E402
from mlxspec.cache import ModelState  # noqa: E402
from mlxspec.errors import MlxspecError  # noqa: E402

WIDTHS = (("draft", 1), ("draft", 4), ("target", 1), ("target", 5), ("target", 8))
GROUPED = lean_attention.heads_per_product


def set_grouped(on: bool) -> None:
    lean_attention.heads_per_product = GROUPED if on else (lambda rep, L: 1)
    blas_layout.module_changes += 1  # compiled traces made under the other setting are stale


def timings(state, history: list[int], width: int, n: int) -> tuple[list[float], list]:
    out, argmax = [], None
    for i in range(n + 2):
        t0 = time.perf_counter()
        pending = state.sync(history)
        logits = state.forward(pending + [100 + j for j in range(width)])
        argmax = mx.argmax(logits, axis=-1).tolist()
        if i >= 2:  # two warm-up calls (a retrace after each switch)
            out.append(time.perf_counter() - t0)
    return out, argmax


def lengths(text: str) -> list[int]:
    """--contexts: comma-separated token counts, each at least 1 (refused before anything loads)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers of tokens, e.g. 100,1500")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=lengths, default="100,1500")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--timings", type=int, default=6)
    args = ap.parse_args()
    try:
        pair = mlxspec.load()
    except MlxspecError as e:
        print(f"grouped_attention: {e}", file=sys.stderr)
        return 2
    same = True
    for n_ctx in args.contexts:
        history = [1000 + (i * 37) % 5000 for i in range(n_ctx)]
        draft, target = ModelState(pair.draft), ModelState(pair.target)
        compiled_forward.attach(draft)
        states = {"draft": draft, "target": target}
        for s in states.values():
            s.prefill(list(history))
        took, seen = {}, {}
        for rep in range(args.repeats):
            for grouped in ((True, False) if rep % 2 == 0 else (False, True)):
                set_grouped(grouped)
                for model, w in WIDTHS:
                    ts, am = timings(states[model], history, w, args.timings)
                    took.setdefault((model, w, grouped), []).extend(ts)
                    same &= seen.setdefault((model, w), am) == am
        set_grouped(True)
        for model, w in WIDTHS:
            g, h = (statistics.median(took[model, w, x]) for x in (True, False))
            print(f"context {n_ctx:5d}  {model:6s} x{w}: grouped {g * 1e3:6.1f} ms, per head {h * 1e3:6.1f} ms, "
                  f"{h / g:.3f}x faster grouped", flush=True)
    print("same argmax in both settings" if same else "ARGMAX DIFFERS")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
