"""Which MLX backend we run on: Metal (or CUDA) or the CPU, the dtype models compute
in there, the memory they may use, and one line describing it (with the Linux CPU
accelerator's BLAS, cpu/openblas.py).

This module must not import mlx at module level.
"""

from __future__ import annotations

import os

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
    from .cpu import describe_blas

    return f"MLX {mx.__version__}, CPU, {describe_blas()}"


def usable_memory_bytes() -> int:
    """Memory the models may use: Metal's recommended working set, or physical
    RAM minus a 20% / 2 GiB margin on the CPU backend."""
    import mlx.core as mx

    if is_gpu():
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        return int(info.get("max_recommended_working_set_size", info.get("memory_size", 0)))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(max(total - max(total * 0.2, 2 << 30), total * 0.5))
