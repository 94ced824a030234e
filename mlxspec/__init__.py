"""mlxspec: lossless speculative decoding for MLX."""

from .backend import preload_openblas as _preload_openblas

_preload_openblas()  # must run before anything imports mlx.core

__version__ = "0.1.0"
