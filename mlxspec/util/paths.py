"""Where mlxspec keeps downloaded wheels, assembled GGUF files and converted models."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$MLXSPEC_HOME`, else `$XDG_CACHE_HOME/mlxspec`, else `~/.cache/mlxspec`."""
    env = os.environ.get("MLXSPEC_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mlxspec"
