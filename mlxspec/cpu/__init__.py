"""The Linux CPU accelerator: everything mlxspec has only for MLX's CPU backend.

OpenBLAS preloaded before MLX (openblas.py), and in front of it a small-batch
matrix kernel compiled for this CPU (kernel.py and its C sources); weights packed,
transposed or rounded to int8 for it (cpu/packed_weights.py, cpu/blas_layout.py,
cpu/draft_weights.py); RoPE, RMSNorm and attention with fewer MLX operations
(layers.py, attention.py, cpu/kernel_ops.py); fused projections; the draft's forward
compiled (cpu/compiled_forward.py).  None of it is on where MLX runs on Metal or CUDA:
there mlx-lm's models run exactly as they are.

One door: the rest of mlxspec uses only the names of this module (the tests of the
mechanisms reach inside).  One switch: `MLXSPEC_CPU_KERNELS=0` turns all of it off
(switches.py); OpenBLAS, a real library, stays.  May import: errors, util, arch.

This module must not import mlx at module level: `openblas.preload_openblas` runs
before mlx.core is imported.
"""

from __future__ import annotations

from .openblas import describe_blas, preload_openblas  # noqa: F401 (public)
from .switches import ALL as SWITCH, all_on  # noqa: F401 (public)

# Element-wise work the kernel takes on the CPU backend, MLX's own ops elsewhere (cpu/kernel_ops.py).
_FORWARDED = {"normalise": "kernel_ops", "probabilities": "kernel_ops", "attach_compiled": "compiled_forward"}


def __getattr__(name):
    module = _FORWARDED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    real = "attach" if name == "attach_compiled" else name
    value = getattr(importlib.import_module(f".{module}", __name__), real)
    globals()[name] = value
    return value


def prepare(model, role: str) -> None:
    """Rewrite a freshly loaded model's layers for the CPU backend (each step a no-op
    where it is off): a draft's weights to int8 (it only proposes; the target decides),
    weights packed for the kernel (16 bits where exact), the rest transposed for BLAS,
    RoPE/RMSNorm slimmed, q/k/v and gate/up fused."""
    from . import blas_layout, draft_weights, fused_projections, layers, packed_weights

    if role == "draft":
        draft_weights.prepare(model)
    packed_weights.prepare(model)
    blas_layout.prepare(model)
    layers.prepare(model)
    fused_projections.prepare(model)


def layout(model) -> str:
    """How `prepare` stored `model`'s weights: "packed <formats>", "blas" or "mlx"."""
    from . import blas_layout, packed_weights

    if model is None:
        return "mlx"
    return packed_weights.layout(model) or ("blas" if blas_layout.transposed(model) else "mlx")


def signature(pair, with_draft: bool) -> dict:
    """What a calibration measured on this pair depends on here: the kernel build, the
    weights' layout, slimmed layers, the compiled draft, fused projections."""
    from . import compiled_forward, fused_projections, kernel, layers

    target, draft = getattr(pair, "target", None), getattr(pair, "draft", None)
    return {"kernel": kernel.build_id(),
            "layout": [layout(target), layout(draft) if with_draft else None],
            "lean": [layers.applied(target), layers.applied(draft) if with_draft else None],
            "compiled_draft": compiled_forward.wanted() if with_draft else None,
            "fused": fused_projections.wanted()}


def kernel_in_use() -> bool:
    """Do matrix products run on the small-batch kernel (where a verify pass is never
    cheaper than a narrower one, so a measured dip is noise)?"""
    from . import kernel

    return kernel.enabled()


# -- the pruned draft head (drafting/vocab_subset.py) ------------------------------------


def is_packed(layer) -> bool:
    """Is `layer` stored packed for the kernel?"""
    from .packed_weights import PackedLinear

    return isinstance(layer, PackedLinear)


def rows_for_blas() -> bool:
    """Are float32 weights stored transposed, as BLAS reads them fastest?"""
    from . import blas_layout

    return blas_layout.wanted()


def draft_rows_rounded() -> bool:
    """Are a draft's weights rounded to int8 for the kernel?"""
    from . import draft_weights

    return draft_weights.wanted()


def pack_rows(wt):
    """The (in, out) float32 rows `wt` for the kernel: int8 where a draft's weights are
    (a draft only proposes), else packed exactly; None without the kernel."""
    import numpy as np

    from . import draft_weights, packed_weights

    if draft_weights.wanted() and wt.shape[0] % draft_weights.QB == 0:
        return draft_weights.Int8Linear.from_rows(np.ascontiguousarray(np.array(wt).T))
    return packed_weights.pack(wt)
