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
* Every JSON file or body mlxspec reads goes through `read_json` / `parse_json`:
  bounded in size, regular files only, and too-deep nesting is one line naming
  the file, never a RecursionError.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import unicodedata
from pathlib import Path

from ..errors import MlxspecError

CODE_KEYS = ("auto_map",)  # config keys that name classes to import from a folder or repo
CODE_FILES = ("config.json", "tokenizer_config.json")
NOTICE = "mlxspec never runs code from model folders"
JSON_MAX_BYTES = 64 << 20  # tokenizer.json files run to ~20 MB; nothing mlxspec reads is larger
JSON_MAX_DEPTH = 64  # deeper than any config, tokenizer, session or request mlxspec reads


def regular_file(path, what: str, max_bytes: int | None = None, *, label: str | None = None) -> int:
    """The size of `path`, refused in one line unless it is a regular file (not a FIFO,
    a device such as /dev/zero, or a folder) of at most `max_bytes`.  Errors name
    it as "`what` `path`", or as `label` when given."""
    label = label or f"{what} {printable(path)}"
    try:
        st = os.stat(path)
    except OSError as e:
        raise MlxspecError(f"cannot read {label}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise MlxspecError(f"{label} is not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise MlxspecError(f"{label} is {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
    return st.st_size


def nested_within(data, limit: int) -> bool:
    """Is `data` nested no deeper than `limit` (iterative: never recurses)?"""
    stack = [(data, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if d > limit:
            return False
        stack.extend((x, d + 1) for x in item if isinstance(x, (dict, list)))
    return True


def parse_json(raw, what: str, max_bytes: int = JSON_MAX_BYTES, max_depth: int = JSON_MAX_DEPTH):
    """`raw` (str or bytes) parsed, or one MlxspecError naming `what`: too large, not
    UTF-8, not JSON, or nested deeper than `max_depth` (checked without recursion)."""
    if len(raw) > max_bytes:
        raise MlxspecError(f"{what} is {len(raw):,} bytes, more than the {max_bytes:,} allowed")
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        data = json.loads(text)
    except RecursionError:
        raise MlxspecError(f"{what} is nested too deeply (more than {max_depth} levels)") from None
    except UnicodeDecodeError:
        raise MlxspecError(f"{what} is not UTF-8 text") from None
    except ValueError as e:
        raise MlxspecError(f"{what} is not valid JSON ({printable(first_line(e), 120)})") from None
    if not nested_within(data, max_depth):
        raise MlxspecError(f"{what} is nested too deeply (more than {max_depth} levels)")
    return data


def read_json(path, what: str | None = None, max_bytes: int = JSON_MAX_BYTES, max_depth: int = JSON_MAX_DEPTH):
    """The JSON file `path`, parsed under `parse_json`'s bounds; a FIFO, a device or a
    folder is refused before anything is read."""
    what = what or str(path)
    regular_file(path, what, max_bytes, label=printable(what))
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise MlxspecError(f"cannot read {printable(what)}: {e.strerror or e}") from None
    return parse_json(raw, printable(what), max_bytes, max_depth)


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
