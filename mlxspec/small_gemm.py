"""The CPU backend's small-batch matrix products (small_gemm.c).

Decoding multiplies 1 to 32 rows of activations by large weight matrices: one
row for a plain step, a few for a verify pass or a draft tree level.  OpenBLAS
(Debian's 0.3.21) packs the weight into panels on every `cblas_sgemm` call,
which here costs more than streaming the weight once: one row through two of the
default target's 1536 x 8960 MLP weights (110 MB) took 5-9 ms where streaming
them takes about 2.7 ms.  small_gemm.c streams each weight row once and
multiplies it into every activation row together, so one row runs at memory
speed and 8 rows cost about 1.2x one (the target's layer weights, matmuls
alone); end to end, `python benchmarks/small_gemm.py`.

The kernel is compiled here, on first use, for this machine's CPU (`cc -O3
-march=native -pthread`; its parallel loops run on one process-wide pool of threads,
thread_pool.c), cached under `cache_dir()/kernels/` by a hash of the
source, the compiler and the CPU, and loaded RTLD_GLOBAL before `mlx.core` so
that MLX's `cblas_sgemm` calls reach it; it forwards every call it is not made
for (more than 32 rows: prefill; a transposed A) to OpenBLAS.  Each output is
summed in one fixed order whatever the number of rows, so a verify pass scores
every position bit for bit as a plain step does.

No compiler, a failed build or MLXSPEC_SMALL_GEMM=0: OpenBLAS takes every call,
as before (`backend.describe()` says which).  Only our own source shipped in
the package is compiled; nothing from a model folder.

This module must not import mlx.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

ENV = "MLXSPEC_SMALL_GEMM"  # "0": OpenBLAS takes every call
SOURCES = tuple(Path(__file__).with_name(f) for f in (
    "small_gemm.c", "draft_gemm.c", "draft_gemm4.c", "thread_pool.c"))  # one library
HEADERS = (Path(__file__).with_name("thread_pool.h"),)
FLAGS = ("-O3", "-march=native", "-pthread", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 120

_state: dict = {"lib": None, "why": None}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def library_path(cc: str) -> Path:
    """Where the build for this source, compiler and CPU is cached."""
    from .paths import cache_dir

    st = os.stat(cc)
    ident = "\0".join([*(s.read_text() for s in SOURCES + HEADERS), os.path.realpath(cc), str(st.st_size),
                       str(st.st_mtime_ns), " ".join(FLAGS), _cpu_flags(), platform.machine()])
    return cache_dir() / "kernels" / f"small_gemm-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.so"


def build() -> Path | None:
    """The compiled kernel (built now if not cached), or None (the reason in `why()`)."""
    from . import tempfiles

    cc = _compiler()
    if cc is None:
        _state["why"] = "no C compiler (cc)"
        return None
    out = library_path(cc)
    if out.exists():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tempfiles.remove_stale(out.parent)
        tmp = tempfiles.temp_name(out.parent, out.stem)
        try:
            r = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", str(tmp), "-ldl", "-lm"], capture_output=True, text=True,
                               timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                lines = r.stderr.strip().splitlines() or ["?"]
                first = next((ln for ln in lines if "error" in ln), lines[-1]).strip()
                _state["why"] = f"the kernel did not compile ({first[:160]})"
                return None
            os.replace(tmp, out)
            for old in out.parent.glob("small_gemm-*.so"):  # builds of an older source or another compiler
                if old != out:
                    old.unlink(missing_ok=True)
        finally:
            tempfiles.remove(tmp)
    except (OSError, subprocess.SubprocessError) as e:
        _state["why"] = f"the kernel could not be built ({e.__class__.__name__}: {e})"[:160]
        return None
    return out


def preload(blas_path: str) -> bool:
    """Build and load the kernel, forwarding what it does not take to `blas_path`.
    Must run before mlx.core is imported and before `blas_path` is loaded."""
    if os.environ.get(ENV, "1") == "0":
        _state["why"] = f"turned off ({ENV}=0)"
        return False
    path = build()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        if lib.mlxspec_gemm_init(blas_path.encode()) != 0:
            _state["why"] = f"it could not bind {blas_path}'s cblas_sgemm"
            return False
    except (OSError, AttributeError) as e:
        _state["why"] = f"it could not be loaded ({e})"[:160]
        return False
    lib.mlxspec_gemm_calls.restype = ctypes.c_long
    lib.mlxspec_gemm_packed_calls.restype = ctypes.c_long
    lib.mlxspec_pool_loops.restype = ctypes.c_long
    _state["lib"], _state["build"] = lib, path.stem
    return True


def build_id() -> str | None:
    """The loaded build (source, compiler and CPU hash; None when not loaded): a
    calibration measured with one build does not price another."""
    return _state.get("build") if _state["lib"] is not None else None


def loaded() -> bool:
    return _state["lib"] is not None


def why() -> str | None:
    """Why the kernel is not in use (None when it is, or was never tried)."""
    return _state["why"]


def set_enabled(on: bool) -> bool:
    """Route small products to the kernel (True) or all to OpenBLAS (False), for
    side-by-side benchmarks in one process; returns the previous setting."""
    lib = _state["lib"]
    return bool(lib.mlxspec_gemm_enable(int(on))) if lib is not None else False


def set_draft_amx(on: bool) -> bool | None:
    """A draft's int8 products over several rows on AMX tiles (True, the default where
    granted) or on VNNI (False), for side-by-side benchmarks; the previous setting, None
    without AMX.  The integer sums are the same either way, so the products are too."""
    lib = _state["lib"]
    old = int(lib.mlxspec_draft_amx(int(on))) if lib is not None else -1
    return None if old < 0 else bool(old)


def enabled() -> bool:
    lib = _state["lib"]
    return lib is not None and bool(lib.mlxspec_gemm_enabled())


def calls() -> int:
    """Products the kernel has computed in this process (0 when not loaded)."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_calls()) if lib is not None else 0


def pool() -> tuple[int, int]:
    """(threads, parallel loops run) of the kernels' one thread pool (thread_pool.c), the caller's
    thread counted; (0, 0) when not loaded."""
    lib = _state["lib"]
    return (int(lib.mlxspec_pool_threads()), int(lib.mlxspec_pool_loops())) if lib is not None else (0, 0)


def packed_calls() -> int:
    """Products on packed weights (packed_weights.py) in this process."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_packed_calls()) if lib is not None else 0


def formats() -> int:
    """The packed weight formats the kernel reads (bits: 1 float32, 2 float16, 4 bfloat16, 8 a draft's int8); 0 when not loaded."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_formats()) if lib is not None else 0


def elementwise() -> int:
    """The element-wise operations the kernel computes (bit 1: SwiGLU, lean_ops.py); 0 when not loaded."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_elementwise()) if lib is not None else 0


def max_rows() -> int:
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_max_rows()) if lib is not None else 0
