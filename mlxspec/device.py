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


DTYPES = ("float32", "float16", "bfloat16")
_requested: str | None = None  # `--dtype`, for every model this process loads from then on


def request_dtype(name: str | None) -> None:
    """`--dtype NAME`: models load and compute in NAME from now on (None: the default)."""
    global _requested
    if name is not None and name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    _requested = name


def compute_dtype(requested: str | None = None):
    """The dtype models compute in: `requested` (or `--dtype`) when given; else
    float32 on the CPU backend (the only dtype with fast BLAS), None on GPU
    (keep the weights' own dtype)."""
    import mlx.core as mx

    name = requested or _requested
    if name is not None:
        if name not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
        return getattr(mx, name)
    return None if is_gpu() else mx.float32


def model_dtype(model) -> str | None:
    """The dtype `model` computes in: that of its first floating-point parameter
    (a quantized layer's scales), e.g. "float16"; None when it has none."""
    from mlx.utils import tree_flatten

    for _, v in tree_flatten(model.parameters()) if hasattr(model, "parameters") else ():
        name = str(getattr(v, "dtype", "")).rpartition(".")[2]
        if name.startswith(("float", "bfloat")):
            return name
    return None


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
