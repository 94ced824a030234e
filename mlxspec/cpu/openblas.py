"""OpenBLAS for MLX's CPU backend, and the small-batch kernel in front of it.

The `mlx[cpu]` wheel bundles the single-threaded reference BLAS; only float32
matmuls go through BLAS at all.  Loading OpenBLAS with RTLD_GLOBAL *before*
`mlx.core` is imported makes `cblas_sgemm` bind to it (~17x faster here, and a
5-token verify costs ~1.3x one token instead of 5x).  So on the CPU backend we
preload OpenBLAS when it is installed (a real library: `MLXSPEC_NO_OPENBLAS=1`
is its only switch), and in front of it the small-batch kernel (kernel.py),
which takes the decode-sized products unless `MLXSPEC_CPU_KERNELS=0`.

This module must not import mlx at module level.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

OPENBLAS_CANDIDATES = (
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)

_state = {"openblas": None, "tried": False, "late": False}


def find_openblas() -> str | None:
    """Path of an OpenBLAS shared library on this machine, or None."""
    override = os.environ.get("MLXSPEC_OPENBLAS")
    if override:
        return override if os.path.exists(override) else None
    arch = platform.machine()
    for pattern in OPENBLAS_CANDIDATES:
        path = pattern.format(arch=arch)
        if os.path.exists(path):
            return path
    return None


def preload_openblas() -> str | None:
    """Load OpenBLAS globally before mlx.core, on Linux.  Idempotent.

    Returns the loaded path, or None (not Linux, disabled with
    MLXSPEC_NO_OPENBLAS=1, not installed, or mlx.core was imported first).
    """
    if _state["tried"]:
        return _state["openblas"]
    _state["tried"] = True
    if not sys.platform.startswith("linux") or os.environ.get("MLXSPEC_NO_OPENBLAS"):
        return None
    if "mlx.core" in sys.modules:
        # Too late: mlx already bound cblas_sgemm to its bundled BLAS.
        _state["late"] = True
        return None
    path = find_openblas()
    if path is None:
        return None
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
    from . import kernel as small_gemm

    small_gemm.preload(path)  # first: MLX's cblas_sgemm binds to the kernel, which forwards the rest to OpenBLAS
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    _state["openblas"] = path
    return path


def describe_blas() -> str:
    """The BLAS MLX's CPU backend uses, in a few words."""
    if _state["openblas"]:
        from . import kernel as small_gemm

        kernel = ("small-batch kernel" if small_gemm.enabled() else "small-batch kernel off") if small_gemm.loaded() \
            else f"no small-batch kernel: {small_gemm.why()}"
        return f"OpenBLAS ({_state['openblas']}; {kernel})"
    if _state["late"]:
        return "reference BLAS (mlx.core was imported before mlxspec; OpenBLAS not loaded)"
    return "reference BLAS (install libopenblas0-pthread for ~10x faster float32)"
