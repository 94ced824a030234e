"""mlxspec: lossless speculative decoding for MLX."""

from .backend import preload_openblas as _preload_openblas

_preload_openblas()  # must run before anything imports mlx.core

from .api import Chunk, GenerationStream, Result, generate, make_decoder, stream_generate  # noqa: E402
from .errors import MlxspecError  # noqa: E402
from .loading import Pair, load  # noqa: E402
from .sampling import SamplingParams  # noqa: E402
from .session import ContextFullError, Session  # noqa: E402
from .stats import GenerationStats  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Chunk", "ContextFullError", "GenerationStats", "GenerationStream", "MlxspecError", "Pair", "Result",
    "SamplingParams", "Session", "generate", "load", "make_decoder", "stream_generate",
]
