"""mlxspec: lossless speculative decoding for MLX.

The public names below are imported on first use (PEP 562), so `import mlxspec`
and the `mlxspec` command start fast and a Ctrl-C while the heavy libraries load
lands in the CLI's own handler (exit 130), not in a module import.

Importing it also (util/private_dirs.py) sets TMPDIR to a folder only this user can write,
unless it already is one: MLX compiles and loads CPU kernels under $TMPDIR/mlx.
"""

import importlib

from .cpu import preload_openblas as _preload_openblas
from .util import open_files_limit as _open_files_limit
from .util import private_dirs as _private_dirs
from .util import startup_signals as _startup_signals

_startup_signals.hold()  # the `mlxspec` command: before any library starts a thread
_private_dirs.secure_mlx_temp()  # MLX's compiled kernels: only from a folder this user alone can write
_open_files_limit.install()  # mlx_lm's open-files limit: no crash under a low hard limit
_preload_openblas()  # must run before anything imports mlx.core

__version__ = "0.1.0"

_EXPORTS = {
    "Chunk": "api", "GenerationStream": "api", "Result": "api", "generate": "api", "make_decoder": "api",
    "stream_generate": "api", "MlxspecError": "errors", "Pair": "models.loading", "load": "models.loading",
    "SamplingParams": "core.sampling", "ContextFullError": "session", "Session": "session",
    "GenerationStats": "core.stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        try:  # a submodule, e.g. mlxspec.api
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
