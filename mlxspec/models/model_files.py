"""A model folder's files, checked before mlx-lm or transformers reads any of them.

mlx-lm and transformers read whatever a folder holds with `json.load`, `open`
and `mx.load`: a FIFO or a symlink to /dev/zero hangs them or fills memory, a
100,000-bracket JSON file is a RecursionError, a config with millions of keys
stalls them.  `check_folder` refuses those first, in one line naming the file:
every file they may read must be a regular file, the JSON ones bounded in size
and nesting (untrusted.read_json).  `model_classes` stands in for mlx-lm's
`_get_classes`, so that a config mlx-lm cannot build a model from (an unknown
model_type, a broken rope_scaling) is reported as the config's fault, not as
corrupt weights.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from ..errors import MlxspecError
from ..util.untrusted import CODE_FILES, CODE_KEYS, JSON_MAX_BYTES, NOTICE, first_line, notice, printable, read_json, regular_file

CONFIG_MAX_BYTES = 1 << 20  # real config.json files are a few KB (the largest known, ~100 KB)
SIDE_JSON = ("generation_config.json", "hf_quant_config.json", "special_tokens_map.json", "added_tokens.json",
             "chat_template.json", "model.safetensors.index.json", "preprocessor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt",
                   "chat_template.jinja", "tokenizer.tiktoken")
TOKENIZER_MAX_BYTES = JSON_MAX_BYTES


class ConfigError(MlxspecError):
    """config.json describes no model mlx-lm can build."""


def read_model_config(folder, required: bool = True) -> dict:
    """config.json of `folder`: a regular file of at most CONFIG_MAX_BYTES holding a JSON
    object; {} when absent and not `required`."""
    path = Path(folder) / "config.json"
    if not required and not (path.exists() or path.is_symlink()):
        return {}
    data = read_json(path, str(path), CONFIG_MAX_BYTES)
    if not isinstance(data, dict):
        raise ConfigError(f"{printable(path)} is not a JSON object (it holds a {type(data).__name__}); "
                          "the model folder is broken")
    return data


def check_tokenizer_files(folder) -> None:
    """The files a tokenizer load reads: regular files, JSON ones bounded."""
    folder = Path(folder)
    read_model_config(folder, required=False)
    _json(folder, "tokenizer_config.json", CONFIG_MAX_BYTES * 16)  # chat templates and added tokens
    for name in ("special_tokens_map.json", "added_tokens.json", "chat_template.json"):
        _json(folder, name, CONFIG_MAX_BYTES * 16)
    for name in TOKENIZER_FILES:
        if _present(folder / name):
            regular_file(folder / name, "tokenizer file", TOKENIZER_MAX_BYTES)


def check_folder(folder) -> dict:
    """Everything mlx-lm reads to build the model in `folder`; returns its config."""
    folder = Path(folder)
    config = read_model_config(folder)
    _check_rope(config, printable(folder / "config.json"))
    for name in SIDE_JSON:
        _json(folder, name, CONFIG_MAX_BYTES * 16)
    for f in sorted(folder.glob("*.safetensors")):
        regular_file(f, "weights file")
    check_tokenizer_files(folder)
    return config


def _check_rope(config: dict, where: str) -> None:
    for c in (config, config.get("text_config")):
        if not isinstance(c, dict):
            continue
        theta = c.get("rope_theta")
        if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float))
                                  or not 0 < theta < float("inf")):
            raise ConfigError(f"{where}: rope_theta must be a positive number, got {printable(repr(theta), 60)}")
        rope = c.get("rope_scaling")
        if rope is not None and not isinstance(rope, dict):
            raise ConfigError(f"{where}: rope_scaling must be an object or null, got {printable(repr(rope), 60)}")


def deep_tokenizer_json(folder) -> None:
    """After a RecursionError from a tokenizer load: the JSON file to blame, in one line."""
    for name in ("tokenizer.json", "vocab.json", "tokenizer_config.json", "special_tokens_map.json",
                 "added_tokens.json", "chat_template.json", "config.json"):
        _json(Path(folder), name, TOKENIZER_MAX_BYTES)


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _json(folder: Path, name: str, max_bytes: int) -> None:
    path = folder / name
    if _present(path):
        read_json(path, str(path), max_bytes)


def model_classes(folder, name: str):
    """A `get_model_classes` for mlx_lm.utils.load_model whose failures name config.json."""
    from mlx_lm.utils import _get_classes

    where = printable(Path(folder) / "config.json")

    def classes(config):
        model_type = config.get("model_type")
        if not isinstance(model_type, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", model_type):
            raise ConfigError(f"{where}: model_type must name an architecture, got {printable(repr(model_type), 60)}")
        try:
            model_class, args_class = _get_classes(config)
        except (ImportError, ValueError, KeyError, TypeError):
            raise ConfigError(f"{where}: unsupported model_type {printable(repr(model_type), 60)} "
                              "(mlx-lm has no such architecture)") from None

        class Args:
            @staticmethod
            def from_dict(cfg):
                return _config_step(args_class.from_dict, cfg, where, name)

        return (lambda args: _config_step(model_class, args, where, name)), Args

    return classes


def _config_step(fn, arg, where: str, name: str):
    try:
        return fn(arg)
    except MlxspecError:
        raise
    except Exception as e:  # KeyError, ValueError, TypeError, AssertionError ... from the model's code
        detail = printable(first_line(e), 120)
        if isinstance(e, KeyError):
            detail = f"field {detail} missing"
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
        if any("rope" in f for f in frames):
            rope = arg.get("rope_scaling") if isinstance(arg, dict) else getattr(arg, "rope_scaling", None)
            raise ConfigError(f"{where}: rope_scaling {printable(repr(rope), 80)} is invalid ({detail})") from None
        raise ConfigError(f"{where}: the {name} cannot be built from it ({detail}); "
                          "check model_type and its fields") from None


def note_code_refs(folder: Path, label: str | None = None) -> dict:
    """Print a one-line notice for each of the folder's config files that has `auto_map`;
    return {file name: the tokenizer class it names} (what transformers would have imported)."""
    found = {}
    for name in CODE_FILES:
        try:
            data = read_json(Path(folder) / name)
        except MlxspecError:
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

    check_tokenizer_files(folder)  # FIFOs, devices, huge or too deeply nested JSON: refused first
    refs = note_code_refs(folder, label)
    try:
        tokenizer = mlx_load_tokenizer(Path(folder), tokenizer_config_extra={"trust_remote_code": False},
                                       eos_token_ids=eos_token_ids)
    except (Exception, RecursionError) as e:  # transformers raises many kinds
        if isinstance(e, RecursionError):  # a JSON file nested too deeply: name it
            deep_tokenizer_json(folder)
        if "trust_remote_code" in str(e):
            ref = refs.get("tokenizer_config.json") or refs.get("config.json") or "auto_map"
            raise MlxspecError(f"{what} needs custom code ({printable(ref)}), which mlxspec never runs; "
                               "use a model whose tokenizer transformers supports") from e
        raise MlxspecError(f"cannot load {what}: {printable(first_line(e))}") from e
    inner = getattr(tokenizer, "_tokenizer", None)
    if isinstance(getattr(inner, "init_kwargs", None), dict):
        inner.init_kwargs.pop("auto_map", None)
    return tokenizer
