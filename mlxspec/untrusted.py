"""Model folders, Hub repos and GGUF files are untrusted input.

* mlxspec never runs code from them.  transformers would, when `auto_map` in
  config.json or tokenizer_config.json names a class (even one in *another* repo,
  `other/repo--module.Class`) and the caller leaves `trust_remote_code` unset: it
  asks on stdin.  Every tokenizer load here passes `trust_remote_code=False`,
  `auto_map` is dropped (with a one-line notice) from what we load and from what
  `mlxspec convert` writes, and a tokenizer that exists only as code is refused.
* Names read from them (a GGUF's `general.name`, folder names) and the CLI's error
  lines go through `printable`, so escape sequences never reach the terminal raw.
* Paths they give (pair.json) stay inside their folder (`confined`).
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

from .errors import MlxspecError

CODE_KEYS = ("auto_map",)  # config keys that name classes to import from a folder or repo
CODE_FILES = ("config.json", "tokenizer_config.json")
NOTICE = "mlxspec never runs code from model folders"


def printable(text, limit: int = 200) -> str:
    """`text` safe to print: control and format characters (ESC, CR, bidi overrides ...)
    escaped visibly as \\x1b / \\u202e, and cut to `limit` characters."""
    text = str(text)
    out = "".join(
        (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs") else ch
        for ch in text
    )
    return out if len(out) <= limit else out[: limit - 3] + "..."


def notice(message: str) -> None:
    print(f"note: {printable(message, 400)}", file=sys.stderr, flush=True)


def strip_code_refs(data):
    """`data` (a parsed config) without `auto_map`, the keys that name classes to import."""
    if not isinstance(data, dict) or not any(k in data for k in CODE_KEYS):
        return data
    return {k: v for k, v in data.items() if k not in CODE_KEYS}


def note_code_refs(folder: Path, label: str | None = None) -> dict:
    """Print a one-line notice for each of the folder's config files that has `auto_map`;
    return {file name: the tokenizer class it names} (what transformers would have imported)."""
    found = {}
    for name in CODE_FILES:
        try:
            data = json.loads((Path(folder) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and any(k in data for k in CODE_KEYS):
            found[name] = _tokenizer_ref(data.get("auto_map"))
            notice(f"ignoring auto_map in {label or folder}/{name}: {NOTICE}")
    return found


def _tokenizer_ref(auto_map) -> str | None:
    ref = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else auto_map
    if isinstance(ref, (list, tuple)):
        ref = next((r for r in reversed(ref) if r), None)
    return ref if isinstance(ref, str) else None


def load_tokenizer(folder: Path, eos_token_ids, what: str, label: str | None = None):
    """mlx-lm's tokenizer wrapper for `folder`, never running code from it.

    `what` names the tokenizer in errors ("the target tokenizer in /x"), `label`
    the folder in notices (default: its path)."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    refs = note_code_refs(folder, label)
    try:
        tokenizer = mlx_load_tokenizer(Path(folder), tokenizer_config_extra={"trust_remote_code": False},
                                       eos_token_ids=eos_token_ids)
    except Exception as e:  # transformers raises many kinds
        if "trust_remote_code" in str(e):
            ref = refs.get("tokenizer_config.json") or refs.get("config.json") or "auto_map"
            raise MlxspecError(f"{what} needs custom code ({printable(ref)}), which mlxspec never runs; "
                               "use a model whose tokenizer transformers supports") from e
        raise MlxspecError(f"cannot load {what}: {printable(first_line(e))}") from e
    inner = getattr(tokenizer, "_tokenizer", None)
    if isinstance(getattr(inner, "init_kwargs", None), dict):
        inner.init_kwargs.pop("auto_map", None)
    return tokenizer


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def confined(root: Path, rel, what: str) -> Path:
    """`root / rel`, refused (one line) unless it resolves to a folder below `root`."""
    if not isinstance(rel, str) or not rel:
        raise MlxspecError(f"{what} must name a subfolder of {root}, got {printable(repr(rel))}")
    path = root / rel
    base = root.resolve()
    resolved = path.resolve()
    if base not in resolved.parents:
        raise MlxspecError(f"{what} {printable(repr(rel))} is not a subfolder of {root}; "
                           "a pair folder only uses its own subfolders (re-run `mlxspec convert`)")
    return path
