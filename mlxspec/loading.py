"""Loading a target/draft pair.

A model may be given as
  * an MLX model folder (mlx-lm layout: config.json, *.safetensors, tokenizer files);
  * a pair folder written by `mlxspec convert` (pair.json, target/, draft/);
  * a `.gguf` file (converted once to an MLX folder and cached, see gguf.py);
  * a name from the built-in weights catalog (e.g. `qwen2.5-coder-1.5b`, see weights.py);
  * a Hugging Face repo id already in the local HF cache (no network needed).
Models are mlx-lm classes; on the CPU backend they compute in float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .backend import compute_dtype
from .cache import check_rollback
from .compat import Compatibility, require_compatible
from .errors import MlxspecError
from .memory import read_config
from .untrusted import confined, first_line, load_tokenizer, printable, strip_code_refs

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


@dataclass
class Pair:
    target: object
    tokenizer: object
    target_path: Path
    target_config: dict
    draft: object | None = None
    draft_path: Path | None = None
    draft_config: dict | None = None
    compatibility: Compatibility | None = None
    pair_dir: Path | None = None  # the `mlxspec convert` folder the pair came from, if any
    subset_ids: dict = field(default_factory=dict, repr=False)  # draft-vocab size -> ids, built once per pair

    @property
    def context_length(self) -> int | None:
        cfgs = [c for c in (self.target_config, self.draft_config) if c]
        lengths = [c.get("max_position_embeddings") for c in cfgs if c.get("max_position_embeddings")]
        return min(lengths) if lengths else None

    @property
    def vocab_size(self) -> int | None:
        """Token ids every loaded model can embed (0 <= id < vocab_size): the
        smallest embedding table, padding rows included (compat.py makes sure
        every tokenizer id has a row in both)."""
        from .token_ids import model_vocab_rows, vocab_rows

        sizes = [model_vocab_rows(self.target) or _embedding_rows(self.target_config or {})]
        if self.draft is not None:
            sizes.append(model_vocab_rows(self.draft) or _embedding_rows(self.draft_config or {}))
        return vocab_rows(*sizes)

    @property
    def eos_token_ids(self) -> set:
        return set(self.tokenizer.eos_token_ids)

    def describe(self) -> str:
        t = model_name(self.target_path, self.target_config)
        if self.draft is None:
            return f"{t} (no draft)"
        return f"{t} drafted by {model_name(self.draft_path, self.draft_config)}"


def model_name(path: Path, config: dict) -> str:
    """A readable name: the GGUF's own name for converted files, else the folder name;
    escape sequences and other control characters in it are shown escaped."""
    source = (config or {}).get("mlxspec")
    source = source if isinstance(source, dict) else {}
    return printable(source.get("general.name") or source.get("source") or path.name, 120)


def _is_pair_dir(p: Path) -> bool:
    return (p / "pair.json").is_file()


def read_pair_manifest(p: Path) -> dict:
    """pair.json, with target_dir and draft_dir: subfolders of `p` (paths leading out are refused)."""
    try:
        manifest = json.loads((p / "pair.json").read_text())
        paths = {role: manifest[role]["path"] for role in ("target", "draft")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MlxspecError(f"{p}/pair.json is unreadable ({printable(e)}); re-run `mlxspec convert`") from e
    dirs = {f"{role}_dir": confined(p, rel, f"{p}/pair.json: the {role} path") for role, rel in paths.items()}
    return {**manifest, **dirs}


def resolve_model_dir(spec: str | Path) -> Path:
    """Any accepted model spec -> a local MLX model folder."""
    spec_str = str(spec)
    path = Path(spec_str).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise MlxspecError(f"GGUF file not found: {path}")
        from .gguf import convert

        return convert(path)
    if path.is_dir():
        if _is_pair_dir(path):
            return read_pair_manifest(path)["target_dir"]
        if not (path / "config.json").is_file():
            raise MlxspecError(f"{path} has no config.json: not an MLX model folder")
        return path
    from . import weights

    name = _catalog_name(spec_str)
    if name is not None:
        return weights.converted(name)
    if spec_str.count("/") == 1 and not path.exists():
        return _from_hf_cache(spec_str)
    raise MlxspecError(
        f"model not found: {spec_str!r} (give a model folder, a pair folder, a .gguf file, "
        f"a cached Hugging Face repo id, or one of: {', '.join(weights.CATALOG)})"
    )


def _catalog_name(spec: str) -> str | None:
    from . import weights

    try:
        return weights.resolve(spec)
    except Exception:
        return None


def _from_hf_cache(repo: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as e:
        raise MlxspecError(
            f"{repo} is not in the local Hugging Face cache; fetch it first "
            f"(`mlxspec convert {repo} --draft ...` or `huggingface-cli download {repo}`)"
        ) from e


def load_model_dir(path: Path, name: str = "model"):
    """(model, tokenizer, config) from an MLX model folder, float32 on CPU.

    Nothing from the folder is executed: a config asking for custom model code
    (`model_file`) is refused, and `auto_map` is ignored (untrusted.py)."""
    from mlx_lm.utils import load_model

    model_file = read_config(path).get("model_file")
    if model_file:
        raise MlxspecError(f"the {name} in {path} needs custom model code ({printable(model_file)}), "
                           "which mlxspec never runs")
    try:
        model, config = load_model(path, trust_remote_code=False)
    except FileNotFoundError as e:
        raise MlxspecError(f"{name} folder {path} is incomplete: {e}") from e
    except ValueError as e:
        raise MlxspecError(f"cannot build the {name} from {path}: {printable(first_line(e))}") from e
    except Exception as e:  # corrupt or truncated safetensors surface as RuntimeError and friends
        raise MlxspecError(f"cannot read the {name} weights in {path} ({printable(first_line(e))}): "
                           "the file is corrupt or truncated; re-download or re-convert it") from e
    dtype = compute_dtype()
    if dtype is not None:
        model.set_dtype(dtype)
    config = strip_code_refs(config)
    tokenizer = load_tokenizer(path, config.get("eos_token_id"), f"the {name} tokenizer in {path}")
    check_rollback(model, name)
    return model, tokenizer, config


def _embedding_rows(config: dict) -> int | None:
    return config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")


def load(target: str | Path | None = None, draft: str | Path | None = None, *, no_draft: bool = False) -> Pair:
    """Load a target and (optionally) a draft model.

    With no target, the default pair (Qwen2.5-Coder 1.5B drafted by 0.5B) is
    used; a pair folder as target brings its own draft.  The tokenizers must be
    compatible (compat.py) or a one-line MlxspecError is raised.
    """
    if target is None:
        target, draft = DEFAULT_TARGET, (draft or DEFAULT_DRAFT)
    tpath = Path(str(target)).expanduser()
    pair_dir = None
    if tpath.is_dir() and _is_pair_dir(tpath):
        pair_dir = tpath
        manifest = read_pair_manifest(tpath)
        target, draft = manifest["target_dir"], draft or manifest["draft_dir"]
    if no_draft:
        draft = None

    target_dir = resolve_model_dir(target)
    draft_dir = resolve_model_dir(draft) if draft is not None else None
    _check_memory(target_dir, draft_dir)
    model, tokenizer, config = load_model_dir(target_dir, "target")
    pair = Pair(model, tokenizer, target_dir, config, pair_dir=pair_dir)
    if draft_dir is not None:
        dmodel, dtok, dconfig = load_model_dir(draft_dir, "draft")
        pair.compatibility = require_compatible(tokenizer, dtok, _embedding_rows(config), _embedding_rows(dconfig))
        pair.draft, pair.draft_path, pair.draft_config = dmodel, draft_dir, dconfig
    return pair


def _check_memory(target_dir: Path, draft_dir: Path | None):
    """Refuse a pair whose weights cannot fit before reading them."""
    try:
        from .memory import check_pair_fits
    except ImportError:
        return
    check_pair_fits(target_dir, draft_dir)
