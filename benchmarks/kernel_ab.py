"""Two builds of the small-batch kernel (mlxspec/cpu/small_gemm.c, cpu/draft_gemm.c) side by side.

    python benchmarks/kernel_ab.py                  # HEAD's sources against the working tree's
    python benchmarks/kernel_ab.py --base 548dfd1 --rows 1,2,4,5,8 --repeats 9
    python benchmarks/kernel_ab.py --format i8      # the int8 draft products (cpu/draft_gemm.c)

Both revisions' sources are compiled with the flags the package uses (and OpenMP
for a revision from before cpu/thread_pool.c) and loaded into one process (RTLD_LOCAL,
so neither replaces MLX's BLAS).  Each repeat
multiplies 1..N activation rows by layers of a model's MLP weights (random
values, the real shapes; about 650 MB, more than the caches keep, as in a real
step) through each build's `cblas_sgemm` in turn, interleaved: with --format f16
(the default) the default target's, packed as float16 column blocks; with
--format i8 the default draft's, as int8 blocks (cpu/draft_weights.py).  Reported is
the median time per row count and build, and the ratio.  Matmuls only:
whole-model effects are measured by the side-by-side benchmarks.  Needs a C
compiler and numpy; no model.
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

from mlxspec.cpu import kernel as small_gemm  # noqa: E402  (does not import mlx)

ROW_MAJOR, NO_TRANS = 101, 111
SHAPES = {"f16": [(1536, 8960), (1536, 8960), (8960, 1536)],  # the default target's gate, up, down (in, out)
          "i8": [(896, 4864), (896, 4864), (4864, 896)]}  # the default draft's
ALPHA_BITS = {"f16": 0x7E5A3C02, "i8": 0x7E5A3C04}  # packed_weights.ALPHA_BITS (that module imports mlx)
SHRINK = {"f16": 2, "i8": 4}  # a packed B travels as float32: A as (s M, K/s), C as (s M, N) (cpu/packed_weights.py)
BETA = {"f16": 0.0, "i8": 1.0}  # an int8 call multiplies the product by C (the scales), with beta 1
IDLE_S = 0.02  # both builds' worker threads spin ~1 ms after a product, then sleep
LAYERS = {"f16": 8, "i8": 48}  # ~650 MB of weights either way: more than the caches keep between repeats


KERNEL_FILES = ("small_gemm.c", "draft_gemm.c", "draft_gemm4.c", "thread_pool.c", "thread_pool.h")
KERNEL_DIRS = ("mlxspec/cpu", "mlxspec")  # where they are, and where they were before the cpu/ package


def sources_at(rev: str | None) -> dict[str, str]:
    """The kernel's files (name: text) at git revision `rev`, or in the working tree (None):
    those of KERNEL_FILES that exist there (an older revision has fewer)."""
    if rev is None:
        return {n: (ROOT / KERNEL_DIRS[0] / n).read_text() for n in KERNEL_FILES if (ROOT / KERNEL_DIRS[0] / n).exists()}
    out = {}
    for folder in KERNEL_DIRS:
        for n in KERNEL_FILES:
            r = subprocess.run(["git", "show", f"{rev}:{folder}/{n}"], cwd=ROOT, capture_output=True, text=True)
            if r.returncode == 0:
                out[n] = r.stdout
        if out:
            break
    if "small_gemm.c" not in out:
        raise SystemExit(f"kernel_ab: no kernel sources at {rev!r}")
    return out


def build(files: dict[str, str], folder: Path) -> ctypes.CDLL:
    """The kernel library from `files` (sources_at), with the package's flags (and OpenMP for
    a revision whose loops were OpenMP's, before cpu/thread_pool.c)."""
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    cc = small_gemm._compiler()
    if cc is None:
        raise SystemExit("no C compiler (cc)")
    flags = [*small_gemm.FLAGS] + (["-fopenmp"] if any("#pragma omp" in t for t in files.values()) else [])
    out = folder / "kernel.so"
    subprocess.run([cc, *flags, *(str(folder / n) for n in files if n.endswith(".c")), "-o", str(out), "-ldl", "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(out), mode=ctypes.RTLD_LOCAL)
    f = lib.cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return f


def packed_f16(w: np.ndarray, nb: int = 64) -> np.ndarray:
    """(K, N) float16 -> column blocks (each block's K rows of nb columns contiguous)."""
    return np.concatenate([w[:, n:n + nb].reshape(-1) for n in range(0, w.shape[1], nb)])


def packed_i8(w: np.ndarray, nb: int = 64) -> np.ndarray:
    """(K, N) int8 -> cpu/draft_gemm.c's blocks (draft_weights.to_blocks for N a multiple of nb)."""
    K, N = w.shape
    u = (w.T.astype(np.int16) + 128).astype(np.uint8)
    return u.reshape(N // nb, nb, K // 4, 4).transpose(0, 2, 1, 3).reshape(-1)


def layer(fmt: str, rng: np.random.Generator, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed weight, C's initial value) of a random (k, n) layer in `fmt`."""
    if fmt == "f16":
        return packed_f16(rng.standard_normal((k, n)).astype(np.float16)), np.zeros(n, np.float32)
    return packed_i8(rng.integers(-127, 128, (k, n), dtype=np.int8)), np.full(n, 1e-3, np.float32)  # C: scales


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git revision of the other source (default HEAD)")
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--format", choices=sorted(SHAPES), default="f16")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    fmt, shrink = args.format, SHRINK[args.format]
    base = sources_at(args.base)
    with tempfile.TemporaryDirectory() as d:
        builds = {args.base: build(base, Path(d) / "base"), "working tree": build(sources_at(None), Path(d) / "tree")}
        alpha = struct.unpack("<f", struct.pack("<I", ALPHA_BITS[fmt]))[0]
        rng = np.random.default_rng(0)
        weights = [(k, n, *layer(fmt, rng, k, n)) for _ in range(LAYERS[fmt]) for k, n in SHAPES[fmt]]
        dims = {k for k, _ in SHAPES[fmt]} | {n for _, n in SHAPES[fmt]}
        times: dict = {}
        for rep in range(args.repeats):
            for m in rows:
                acts = {k: rng.standard_normal((m, k)).astype(np.float32) for k in dims}
                order = list(builds.items())
                for name, f in order if rep % 2 == 0 else order[::-1]:
                    outs = [np.tile(c0, (shrink * m, 1)) for _, _, _, c0 in weights]  # before the clock: C is overwritten
                    time.sleep(IDLE_S)  # the other build's idle threads stop spinning (each build has its own)
                    t = time.perf_counter()
                    for (k, n, w, _), out in zip(weights, outs):
                        f(ROW_MAJOR, NO_TRANS, NO_TRANS, shrink * m, n, k // shrink, alpha, acts[k].ctypes.data, k // shrink,
                          w.ctypes.data, n, BETA[fmt], out.ctypes.data, n)
                    times.setdefault((m, name), []).append(time.perf_counter() - t)
    names = list(builds)
    print(f"{len(weights)} packed {'float16' if fmt == 'f16' else 'int8'} products per run, median of {args.repeats} (ms):")
    print(f"{'rows':>5} {names[0]:>14} {names[1]:>14}  ratio")
    for m in rows:
        a, b = (statistics.median(times[(m, n)]) * 1e3 for n in names)
        print(f"{m:>5} {a:>14.1f} {b:>14.1f}  {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
