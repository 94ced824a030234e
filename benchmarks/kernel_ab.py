"""Two builds of the small-batch kernel (mlxspec/small_gemm.c) side by side.

    python benchmarks/kernel_ab.py                  # HEAD's source against the working tree's
    python benchmarks/kernel_ab.py --base 548dfd1 --rows 1,2,4,5,8 --repeats 9

Both sources are compiled with the flags the package uses and loaded into one
process (RTLD_LOCAL, so neither replaces MLX's BLAS).  Each repeat multiplies
1..N activation rows by the default target's MLP weights, packed as float16
column blocks (8 layers of gate, up and down: random values, the real shapes),
through each build's `cblas_sgemm` in turn, interleaved; reported is the median
time per row count and build, and the ratio.  Matmuls only: whole-model effects
are measured by the side-by-side benchmarks.  Needs a C compiler and numpy; no
model.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxspec import small_gemm  # noqa: E402  (does not import mlx)

ROW_MAJOR, NO_TRANS = 101, 111
SHAPES = [(1536, 8960), (1536, 8960), (8960, 1536)]  # the default target's gate, up, down (in, out)
LAYERS = 8


def build(source: str, out: Path) -> ctypes.CDLL:
    """small_gemm.c from `source`, with the working tree's other sources (draft_gemm.c)."""
    src = out.with_suffix(".c")
    src.write_text(source)
    cc = small_gemm._compiler()
    if cc is None:
        raise SystemExit("no C compiler (cc)")
    others = [str(s) for s in small_gemm.SOURCES if s != small_gemm.SOURCE]
    subprocess.run([cc, *small_gemm.FLAGS, str(src), *others, "-o", str(out), "-ldl", "-lm"], check=True)
    lib = ctypes.CDLL(str(out), mode=ctypes.RTLD_LOCAL)
    f = lib.cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return f


def packed_f16(w: np.ndarray, nb: int = 64) -> np.ndarray:
    """(K, N) float16 -> column blocks (each block's K rows of nb columns contiguous)."""
    return np.concatenate([w[:, n:n + nb].reshape(-1) for n in range(0, w.shape[1], nb)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git revision of the other source (default HEAD)")
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,16")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    base = subprocess.run(["git", "show", f"{args.base}:mlxspec/small_gemm.c"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as d:
        builds = {args.base: build(base, Path(d) / "base.so"),
                  "working tree": build(small_gemm.SOURCE.read_text(), Path(d) / "tree.so")}
        alpha = struct.unpack("<f", struct.pack("<I", 0x7E5A3C02))[0]  # packed_weights.ALPHA_BITS["f16"]
        rng = np.random.default_rng(0)
        weights = [(k, n, packed_f16(rng.standard_normal((k, n)).astype(np.float16)))
                   for _ in range(LAYERS) for k, n in SHAPES]
        times: dict = {}
        for rep in range(args.repeats):
            for m in rows:
                acts = {k: rng.standard_normal((m, k)).astype(np.float32) for k in (1536, 8960)}
                outs = {n: np.zeros((2 * m, n), np.float32) for n in (1536, 8960)}
                order = list(builds.items())
                for name, f in order if rep % 2 == 0 else order[::-1]:
                    t = time.perf_counter()
                    for k, n, w in weights:  # a 16-bit B: A as (2M, K/2), C as (2M, N) (packed_weights.py)
                        f(ROW_MAJOR, NO_TRANS, NO_TRANS, 2 * m, n, k // 2, alpha, acts[k].ctypes.data, k // 2,
                          w.ctypes.data, n, 0.0, outs[n].ctypes.data, n)
                    times.setdefault((m, name), []).append(time.perf_counter() - t)
    names = list(builds)
    print(f"{len(weights)} packed float16 products per run, median of {args.repeats} (ms):")
    print(f"{'rows':>5} {names[0]:>14} {names[1]:>14}  ratio")
    for m in rows:
        a, b = (statistics.median(times[(m, n)]) * 1e3 for n in names)
        print(f"{m:>5} {a:>14.1f} {b:>14.1f}  {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
