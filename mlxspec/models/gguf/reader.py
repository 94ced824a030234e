"""Reading a GGUF file: the reader (every tensor checked to lie inside the file), its
metadata and dequantised tensors.  Errors name the file as not a valid GGUF file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import MlxspecError


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def _corrupt(path: Path, what: str) -> MlxspecError:
    return MlxspecError(f"{path}: not a valid or complete GGUF file ({what}); delete it and fetch it again")


def open_gguf(path: Path):
    """A `gguf.GGUFReader` for `path`, after checking every tensor lies inside the file."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        size = path.stat().st_size
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
                raise ValueError(f"tensor {t.name} runs past the end of the file")
        reader.fields["general.architecture"].contents()
    except MlxspecError:
        raise
    except Exception as e:  # gguf/numpy raise ValueError, KeyError, IndexError, struct errors, ...
        raise _corrupt(path, _one_line(e)) from None
    return reader


def metadata(reader) -> dict:
    """Every metadata value by key (the file header's own `GGUF.*` fields left out)."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def dequantize(path: Path, tensor) -> np.ndarray:
    """float32 numpy array of `tensor` in row-major (mlx) shape; rejects non-finite weights."""
    from gguf.quants import dequantize as gguf_dequantize

    shape = tuple(int(n) for n in reversed(tensor.shape))
    try:
        with np.errstate(all="ignore"):  # corrupt scales give inf/nan: reported below, not warned about
            w = gguf_dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False).reshape(shape)
    except Exception as e:
        raise _corrupt(path, f"tensor {tensor.name}: {_one_line(e)}") from None
    if not np.isfinite(w).all():
        raise _corrupt(path, f"tensor {tensor.name} has non-finite values")
    return w
