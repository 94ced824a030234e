"""Idle pool workers that spin with a sched_yield() every YIELD_EVERY pauses (the patch), against
pure pause spins (as before stop 55).

    python benchmarks/records/2026-12-06-stop55/spin_yield_ab.py --suite code --max-tokens 64

One process, the default pair loaded once; plain decoding and the default, each with the worker's
spin as the patch sets it and without its yields (thread_pool.c's mlxspec_pool_yield, switched per run),
interleaved on each prompt, warm, in a rotating order.
Runs only with spin-yield-not-kept.patch applied (git apply), which adds mlxspec_pool_yield;
the change was not kept (see the records README).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import small_gemm  # noqa: E402
from mlxspec.bench_contenders import make_contender  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from side_by_side import arguments, chosen_prompts, report  # noqa: E402

def main() -> int:
    args = arguments(__doc__, "0", 64, "spin-yield-ab.json")
    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    lib = small_gemm._state["lib"]
    lib.mlxspec_pool_yield.argtypes = [ctypes.c_int]
    shipped = lib.mlxspec_pool_yield(0)
    lib.mlxspec_pool_yield(shipped)
    contenders = {"plain": ("plain", shipped), "plain no yield": ("plain", 0),
                  "default": ("model:auto", shipped), "default no yield": ("model:auto", 0)}
    made = {n: make_contender(spec) for n, (spec, _) in contenders.items()}

    def run(name, ids, n):
        lib.mlxspec_pool_yield(contenders[name][1])
        try:
            return made[name].run(pair, ids, temp=0.0, max_tokens=n, seed=0)
        finally:
            lib.mlxspec_pool_yield(shipped)

    print(f"yield every {shipped} pauses as shipped", flush=True)
    return report(args, prompts, pair, list(contenders), run,
                  ["default / plain", "default no yield / plain no yield", "default / default no yield",
                   "plain / plain no yield", "default / plain no yield"])


if __name__ == "__main__":
    sys.exit(main())
