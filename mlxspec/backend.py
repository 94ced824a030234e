"""Which MLX backend we run on, and making the Linux CPU backend fast.

The `mlx[cpu]` wheel bundles the single-threaded reference BLAS; only float32
matmuls go through BLAS at all.  Loading OpenBLAS with RTLD_GLOBAL *before*
`mlx.core` is imported makes `cblas_sgemm` bind to it (~17x faster here, and a
5-token verify costs ~1.3x one token instead of 5x).  So on the CPU backend we
preload OpenBLAS when it is installed and compute in float32, and in front of
it the small-batch kernel of small_gemm.py, which takes the decode-sized
products.

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
    from . import small_gemm

    small_gemm.preload(path)  # first: MLX's cblas_sgemm binds to the kernel, which forwards the rest to OpenBLAS
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    _state["openblas"] = path
    return path


def is_gpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.gpu


def compute_dtype():
    """float32 on the CPU backend (the only dtype with fast BLAS), None on GPU
    (keep the weights' own dtype)."""
    import mlx.core as mx

    return None if is_gpu() else mx.float32


def describe() -> str:
    """One line: backend and BLAS, for logs, stats and benchmark reports."""
    import mlx.core as mx

    if is_gpu():
        return f"MLX {mx.__version__}, Metal GPU"
    if _state["openblas"]:
        from . import small_gemm

        kernel = ("small-batch kernel" if small_gemm.enabled() else "small-batch kernel off") if small_gemm.loaded() \
            else f"no small-batch kernel: {small_gemm.why()}"
        blas = f"OpenBLAS ({_state['openblas']}; {kernel})"
    elif _state["late"]:
        blas = "reference BLAS (mlx.core was imported before mlxspec; OpenBLAS not loaded)"
    else:
        blas = "reference BLAS (install libopenblas0-pthread for ~10x faster float32)"
    return f"MLX {mx.__version__}, CPU, {blas}"


def usable_memory_bytes() -> int:
    """Memory the models may use: Metal's recommended working set, or physical
    RAM minus a 20% / 2 GiB margin on the CPU backend."""
    import mlx.core as mx

    if is_gpu():
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        return int(info.get("max_recommended_working_set_size", info.get("memory_size", 0)))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(max(total - max(total * 0.2, 2 << 30), total * 0.5))
