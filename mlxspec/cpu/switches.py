"""The Linux CPU accelerator's switches.

One switch turns all of it off: `MLXSPEC_CPU_KERNELS=0` (the small-batch kernel,
packed / int8 / transposed weights, slimmed layers and attention, fused projections,
the compiled draft forward).  OpenBLAS is a real library, not ours: it stays (its own
switch is `MLXSPEC_NO_OPENBLAS=1`).  Each mechanism keeps its own variable for A/B
runs (docs/linux-cpu.md lists them); none of them is on where the backend is not the
CPU (Metal keeps mlx-lm's models exactly as they are).

This module must not import mlx at module level: the kernel asks it before
mlx.core is loaded.
"""

from __future__ import annotations

import os

ALL = "MLXSPEC_CPU_KERNELS"  # "0": every part of the Linux CPU accelerator off
LAYERS = "MLXSPEC_LEAN"  # "0": keep mlx-lm's RoPE and RMSNorm modules (layers.py, attention.py)


def all_on() -> bool:
    """Is the accelerator as a whole allowed (`MLXSPEC_CPU_KERNELS` is not "0")?"""
    return os.environ.get(ALL, "1") != "0"


def cpu_backend() -> bool:
    """Does MLX run on its CPU backend (not Metal or CUDA)?"""
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu


def on(env: str | None = None) -> bool:
    """Is the mechanism behind `env` on: the accelerator allowed, its own variable not
    "0", and MLX on its CPU backend?"""
    return all_on() and (env is None or os.environ.get(env, "1") != "0") and cpu_backend()
