"""4-bit by default on Metal: which model folders are quantised as they load (models/loading.py)
and budgeted so (models/memory.py).

Quantising at load, rather than converting a second, 4-bit cache entry, keeps one
converted folder per GGUF file for both backends (the CPU backend needs the float16
one), works for folders converted before this existed, and costs a second or two per
load on Metal (the quantisation runs on the GPU, over weights read lazily).
"""

from __future__ import annotations

import os

GROUP_SIZE = 64
METAL_BITS = 4  # a GGUF conversion (float16 folder) runs 4-bit affine on Metal, as mlx-lm's convert makes it


def bits_at_load(config: dict | None) -> int | None:
    """The bits a folder's float weights are quantised to when loaded (models/loading.py), or None.

    On Metal a folder converted from GGUF (config "mlxspec", float16 storage) is
    quantised to 4-bit affine weights, group size 64, embeddings and lm_head included
    (mlx_lm.utils.quantize_model, as `mlx_lm.convert -q` does): the default pair's
    Q4_K_M files come back to 4 bits there instead of taking twice the memory and
    bandwidth at float16.  Never on the CPU backend (float16 storage, float32 compute,
    cpu/), nor for a folder already quantised; MLXSPEC_METAL_4BIT=0 keeps float16."""
    from ..device import is_gpu

    cfg = config or {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    if not isinstance(cfg.get("mlxspec"), dict) or cfg.get("quantization") or text.get("quantization"):
        return None
    if os.environ.get("MLXSPEC_METAL_4BIT", "1") == "0" or not is_gpu():
        return None
    return METAL_BITS
