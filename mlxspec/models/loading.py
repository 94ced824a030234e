"""Loading a target/draft pair.

A model may be given as
  * an MLX model folder (mlx-lm layout: config.json, *.safetensors, tokenizer files);
  * a pair folder written by `mlxspec convert` (pair.json, target/, draft/);
  * a `.gguf` file (converted once to an MLX folder and cached, see models/gguf/convert.py);
  * a name from the built-in weights catalog (e.g. `qwen2.5-coder-1.5b`, see models/pinned/fetch.py);
  * a Hugging Face repo id already in the local HF cache (no network needed).
Models are mlx-lm classes; on the CPU backend they compute in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..device import compute_dtype, model_dtype  # noqa: F401 (model_dtype public here too)
from ..core.cache import check_rollback
from .tokenizer_compat import Compatibility, require_compatible
from ..errors import MlxspecError
from .memory import check_config
from .metal_4bit import GROUP_SIZE, bits_at_load
from ..util.untrusted import first_line, printable, strip_code_refs
from .model_files import load_tokenizer
from .locate import _from_hf_cache, _is_pair_dir, catalog_name, read_pair_manifest, resolve_local_dir, resolve_model_dir, resolve_present  # noqa: F401 (public here too)

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
    draft_note: str = ""  # how the draft was chosen, or why there is none (shown by describe())
    subset_ids: dict = field(default_factory=dict, repr=False)  # draft-vocab size -> ids, built once per pair

    @property
    def context_length(self) -> int | None:
        cfgs = [c for c in (self.target_config, self.draft_config) if c]
        lengths = [c.get("max_position_embeddings") for c in cfgs if c.get("max_position_embeddings")]
        return min(lengths) if lengths else None

    @property
    def vocab_size(self) -> int | None:
        """Token ids every loaded model can embed (0 <= id < vocab_size): the
        smallest embedding table, padding rows included (models/tokenizer_compat.py makes sure
        every tokenizer id has a row in both)."""
        from ..core.token_ids import model_vocab_rows, vocab_rows

        sizes = [model_vocab_rows(self.target) or _embedding_rows(self.target_config or {})]
        if self.draft is not None:
            sizes.append(model_vocab_rows(self.draft) or _embedding_rows(self.draft_config or {}))
        return vocab_rows(*sizes)

    @property
    def eos_token_ids(self) -> set:
        return set(self.tokenizer.eos_token_ids)

    def describe(self) -> str:
        """One line naming both models (catalog name, source format, compute dtype) and
        how the draft was chosen: the header line of `generate` and `chat`."""
        t = model_label(self.target_path, self.target_config, model_dtype(self.target))
        if getattr(self.target, "mlxspec_sharding", None):  # split over mlx.launch's ranks (distributed/)
            t = f"{t[:-1]}; {self.target.mlxspec_sharding})" if t.endswith(")") else f"{t} ({self.target.mlxspec_sharding})"
        if self.draft is None:
            return f"{t}; {self.draft_note or 'no draft model'}"
        d = model_label(self.draft_path, self.draft_config, model_dtype(self.draft))
        return f"{t} drafted by {d}" + (f", {self.draft_note}" if self.draft_note else "")


def model_name(path: Path, config: dict) -> str:
    """A readable name: the catalog name of a pinned model, else the GGUF's own name for
    converted files, else the folder name; escape sequences and other control
    characters in it are shown escaped."""
    source = _source(config)
    spec = _catalog_spec(source)
    if spec is not None:
        return spec.name
    return printable(source.get("general.name") or source.get("source") or path.name, 120)


def model_label(path: Path, config: dict, dtype: str | None = None) -> str:
    """model_name plus what the weights came from and the dtype they compute in:
    "qwen2.5-coder-0.5b (GGUF Q4_K_M, float32)"."""
    source = _source(config)
    spec = _catalog_spec(source)
    if spec is not None:
        origin = spec.source_format
    elif source:
        origin = f"GGUF {printable(source['file_type'], 20)}" if source.get("file_type") else "GGUF"
    else:
        origin = "MLX"
    from ..device import compute_dtype

    if dtype is None:
        dtype = compute_dtype()
        dtype = None if dtype is None else str(dtype).rpartition(".")[2]
    if dtype is None:
        cfg = config or {}
        dtype = printable(str(cfg.get("torch_dtype") or cfg.get("dtype") or "own dtype"), 20)
    quant = (config or {}).get("quantization")
    if source and isinstance(quant, dict) and quant.get("bits"):  # quantised at load (Metal, models/metal_4bit.py)
        dtype = f"{printable(str(quant['bits']), 4)}-bit, {dtype}"
    return f"{model_name(path, config)} ({origin}, {dtype})"


def _source(config: dict) -> dict:
    source = (config or {}).get("mlxspec")
    return source if isinstance(source, dict) else {}


def _catalog_spec(source: dict):
    """The weights.CATALOG entry a converted folder came from (by its GGUF's SHA-256), or None."""
    digest = source.get("sha256")
    if not isinstance(digest, str):
        return None
    from .pinned.fetch import CATALOG

    return next((spec for spec in CATALOG.values() if spec.sha256 == digest), None)


PARTNER_NOTE = "its catalog partner, loaded by default (--no-draft for none)"


def default_draft(target) -> tuple[str | None, str]:
    """(draft spec, note) for a target given without a draft: its catalog partner
    (weights.PARTNERS for catalog names; converters.catalog.PAIRS for Hub repos in
    the local HF cache), or None with a note saying why there is none."""
    name = catalog_name(str(target))
    if name is not None:
        from .pinned.fetch import PARTNERS

        if name in PARTNERS:
            return PARTNERS[name], PARTNER_NOTE
        return None, (f"no draft model (the catalog has no partner for {name}): drafting is off; "
                      "--draft MODEL, or --drafter lookup to draft from the prompt")
    from ..converters.catalog import PAIRS

    partners = [d for t, d in PAIRS if t == str(target)]
    for d in partners:
        try:
            _from_hf_cache(d)
        except MlxspecError:
            continue
        return d, PARTNER_NOTE
    if partners:
        return None, (f"no draft model: its catalog partner {partners[0]} is not in the Hugging Face cache "
                      f"(`hf download {partners[0]}`, then --draft {partners[0]})")
    return None, "no draft model"


def load_model_dir(path: Path, name: str = "model", dtype: str | None = None, shard=None):
    """(model, tokenizer, config) from an MLX model folder, in `dtype` (float32,
    float16 or bfloat16; default `--dtype`, else float32 on CPU, the weights' own on GPU).
    The Linux CPU accelerator (cpu/) is float32 only: a model in another dtype runs on MLX's own ops.

    Nothing from the folder is executed: a config asking for custom model code
    (`model_file`) is refused, and `auto_map` is ignored (util/untrusted.py).
    `shard`: a distributed.Sharding that splits the model, still lazy, with mlx-lm's own
    `shard` or `pipeline`, so that only this rank's share is read (MLX's own ops run it)."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    from .. import cpu
    from .model_files import check_folder, model_classes

    model_file = check_config(check_folder(path), path / "config.json").get("model_file")
    if model_file:
        raise MlxspecError(f"the {name} in {path} needs custom model code ({printable(model_file)}), "
                           "which mlxspec never runs")
    try:
        model, config = load_model(path, lazy=True, trust_remote_code=False,
                                   get_model_classes=model_classes(path, name))
        bits = bits_at_load(config)
        if bits:  # Metal: a GGUF conversion back to 4-bit affine (models/memory.bits_at_load), still lazy
            import contextlib
            import io

            from mlx_lm.utils import quantize_model

            with contextlib.redirect_stdout(io.StringIO()):  # its "[INFO] Quantized model ..." line: not our output
                model, config = quantize_model(model, config, GROUP_SIZE, bits)
        if shard is not None:
            shard.apply(model, config)
        want = compute_dtype(dtype)
        if want is not None:  # cast while loading: a float16 folder never sits in memory twice
            model.set_dtype(want)
        mx.eval(model.parameters())
        if (want is None or want == mx.float32) and shard is None:  # the accelerator's kernels: float32, whole
            cpu.prepare(model, name)  # the Linux CPU accelerator (cpu/): a no-op on Metal or when switched off
    except MlxspecError:
        raise  # config.json's own faults (models/model_files.py), named as such
    except FileNotFoundError as e:
        raise MlxspecError(f"{name} folder {path} is incomplete: {e}") from e
    except ValueError as e:
        raise MlxspecError(f"cannot build the {name} from {path}: {printable(first_line(e))}") from e
    except Exception as e:  # corrupt or truncated safetensors surface as RuntimeError and friends
        raise MlxspecError(f"cannot read the {name} weights in {path} ({printable(first_line(e))}): "
                           "the file is corrupt or truncated; re-download or re-convert it") from e
    config = strip_code_refs(config)
    tokenizer = load_tokenizer(path, config.get("eos_token_id"), f"the {name} tokenizer in {path}")
    _no_length_warning(tokenizer)
    check_rollback(model, name)
    return model, tokenizer, config


def _no_length_warning(tokenizer) -> None:
    """transformers warns ("Token indices sequence length is longer than the specified
    maximum ...") when a text encodes to more tokens than the tokenizer's
    model_max_length; mlxspec checks prompts against the model's context itself
    (a one-line error), so the tokenizer is told there is no limit of its own."""
    import sys

    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        inner.model_max_length = sys.maxsize
    except (AttributeError, TypeError):
        pass


def _embedding_rows(config: dict) -> int | None:
    return config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")


def load(target: str | Path | None = None, draft: str | Path | None = None, *, no_draft: bool = False,
         dtype: str | None = None, shard=None) -> Pair:
    """Load a target and (optionally) a draft model.

    With no target, the default pair (Qwen2.5-Coder 1.5B drafted by 0.5B) is
    used; a target the catalog knows a partner for brings it (`default_draft`);
    a pair folder as target brings its own draft.  The tokenizers must be
    compatible (models/tokenizer_compat.py) or a one-line MlxspecError is raised -- before
    anything is fetched or converted when that can be told (models/pair_check.py).
    `dtype` ("float32", "float16" or "bfloat16"): what both models compute in (default:
    float32 on the CPU backend, the weights' own dtype on a GPU).
    `shard` (distributed.Sharding, under mlx.launch): the target is split over the ranks and each
    rank's memory is checked against its share; ranks other than 0 load no draft.
    """
    from ..device import DTYPES

    if dtype is not None and dtype not in DTYPES:
        raise MlxspecError(f"dtype must be one of {', '.join(DTYPES)}, got {printable(str(dtype), 40)}")
    from . import pair_check
    from ..util import progress

    if target is None:
        target = DEFAULT_TARGET
    tpath = Path(str(target)).expanduser()
    pair_dir, note = None, ""
    if tpath.is_dir() and _is_pair_dir(tpath):
        pair_dir = tpath
        manifest = read_pair_manifest(tpath)
        target, draft = manifest["target_dir"], draft or manifest["draft_dir"]
    if no_draft or (shard is not None and shard.rank):
        draft, note = None, "no draft model"
    elif draft is None:
        draft, note = default_draft(target)
    if draft is not None:
        pair_check.refuse_incompatible(target, draft)

    target_dir = resolve_model_dir(target)
    draft_dir = resolve_model_dir(draft) if draft is not None else None
    if shard is None:
        _check_memory(target_dir, draft_dir)
    else:
        shard.check_memory(target_dir, draft_dir)
    with progress.bar("loading the target", total=2 if draft_dir is not None else 1, unit="model") as bar:
        model, tokenizer, config = load_model_dir(target_dir, "target", dtype, shard)
        pair = Pair(model, tokenizer, target_dir, config, pair_dir=pair_dir, draft_note=note)
        bar.update(1)
        if draft_dir is not None:
            bar.set_description("loading the draft")
            dmodel, dtok, dconfig = load_model_dir(draft_dir, "draft", dtype)
            pair.compatibility = require_compatible(tokenizer, dtok, _embedding_rows(config), _embedding_rows(dconfig))
            pair.draft, pair.draft_path, pair.draft_config = dmodel, draft_dir, dconfig
            bar.update(1)
    return pair


def _check_memory(target_dir: Path, draft_dir: Path | None):
    """Refuse a pair whose weights cannot fit before reading them."""
    try:
        from .memory import check_pair_fits
    except ImportError:
        return
    check_pair_fits(target_dir, draft_dir)
