"""Where a model spec points: a folder, a pair folder (pair.json), a .gguf file, a
catalog name (pinned weights) or a repo id in the local Hugging Face cache.
Nothing here loads a model; `resolve_present` never downloads."""

from __future__ import annotations

from pathlib import Path

from ..errors import MlxspecError
from ..util.untrusted import confined, printable, read_json, regular_file


def _is_pair_dir(p: Path) -> bool:
    return (p / "pair.json").is_file()


def read_pair_manifest(p: Path) -> dict:
    """pair.json, with target_dir and draft_dir: subfolders of `p` (paths leading out are refused)."""
    manifest = read_json(p / "pair.json", f"{p}/pair.json", 1 << 20)
    try:
        paths = {role: manifest[role]["path"] for role in ("target", "draft")}
    except (KeyError, TypeError) as e:
        raise MlxspecError(f"{p}/pair.json is unreadable ({printable(e)}); re-run `mlxspec convert`") from e
    dirs = {f"{role}_dir": confined(p, rel, f"{p}/pair.json: the {role} path") for role, rel in paths.items()}
    return {**manifest, **dirs}


def resolve_model_dir(spec: str | Path) -> Path:
    """Any accepted model spec -> a local MLX model folder (fetching and converting a
    catalog model, converting a .gguf file)."""
    spec_str = str(spec)
    path = Path(spec_str).expanduser()
    if path.suffix == ".gguf":
        if not (path.exists() or path.is_symlink()):
            raise MlxspecError(f"{printable(str(path))}: no such GGUF file")
        regular_file(path, "GGUF file")
        from .gguf.convert import convert

        return convert(path)
    name = catalog_name(spec_str)
    if name is not None:
        from .pinned import fetch as weights

        return weights.converted(name)
    return resolve_local_dir(spec)


def resolve_present(spec: str | Path) -> Path:
    """resolve_model_dir that never fetches: a catalog model must have been pulled
    (Session.load uses this: a session file cannot make mlxspec download)."""
    name = catalog_name(str(spec))
    if name is None:
        return resolve_model_dir(spec)  # folders, pair folders, cached HF repos, .gguf files: all local
    from .pinned import fetch as weights

    if not weights.is_present(name):
        raise MlxspecError(f"model {name} is not in the mlxspec cache (fetch it with `mlxspec pull {name}`)")
    return weights.converted(name)


def resolve_local_dir(spec: str | Path) -> Path:
    """A model folder, a pair folder (its target) or a cached Hugging Face repo id -> the
    MLX model folder; nothing is fetched or converted."""
    from .pinned import fetch as weights

    spec_str = str(spec)
    path = Path(spec_str).expanduser()
    if path.is_dir():
        if _is_pair_dir(path):
            return read_pair_manifest(path)["target_dir"]
        if not ((path / "config.json").exists() or (path / "config.json").is_symlink()):
            raise MlxspecError(f"{printable(str(path))} has no config.json: not an MLX model folder")
        return path
    if path.exists():
        raise MlxspecError(f"{printable(str(path))} is a file, not a model folder or .gguf file")
    if _looks_like_path(spec_str):
        raise MlxspecError(f"{printable(spec_str)}: no such file or folder")
    if spec_str.count("/") == 1:
        return _from_hf_cache(spec_str)
    raise MlxspecError(
        f"model not found: {printable(repr(spec_str))} (give a model folder, a pair folder, a .gguf file, "
        f"a cached Hugging Face repo id, or one of: {', '.join(weights.CATALOG)})"
    )


def _looks_like_path(spec: str) -> bool:
    """A spec that can only be a path (not a repo id "org/name", nor a catalog name)."""
    return (spec.startswith(("/", "./", "../", "~")) or spec in (".", "..") or spec.count("/") > 1
            or "\\" in spec)


def catalog_name(spec: str) -> str | None:
    """The weights catalog name `spec` stands for (an exact name or a unique prefix),
    unless it names an existing file or folder."""
    from .pinned import fetch as weights

    if _looks_like_path(spec) or Path(spec).expanduser().exists():
        return None
    try:
        return weights.resolve(spec)
    except MlxspecError:
        return None


def _from_hf_cache(repo: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as e:
        raise MlxspecError(
            f"{printable(repo)} is neither a local folder nor in the Hugging Face cache; fetch it first "
            f"with `hf download {printable(repo)}`"
        ) from e
