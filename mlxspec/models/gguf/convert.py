"""GGUF files (llama, qwen2, gemma3; any quantisation) -> mlx-lm model folders.

    folder = convert("SmolLM2-135M-Instruct.Q4_1.gguf")   # cache_dir()/models/<sha256>/
    model, tokenizer = mlx_lm.utils.load(str(folder))

The folder holds what `mlx_lm.utils.load` reads:

* `model.safetensors` (or `model-0000i-of-0000n.safetensors` shards): every tensor
  dequantised with the `gguf` package, under mlx-lm names.  Matrices are stored as
  **float16** (2 bytes per parameter, half the disk of float32); vectors (norms,
  biases) and any matrix float16 cannot hold stay float32.  The loader computes in
  float32 on the CPU backend (models/loading.py casts; only float32 matmuls use BLAS) and in
  float16 on Metal, as mlx-lm does.  The rounding is recorded in `config.json`
  (`mlxspec.storage`: the largest absolute and relative change of any weight); it is
  far below the GGUF's own quantisation step (README, "Weights").  Folders of the
  older float32 format (1) keep working as they are.
* `config.json` for `mlx_lm.models.{llama,qwen2,gemma3_text}`.  llama GGUFs store
  Q/K rows permuted for interleaved RoPE, so they get `rope_traditional: true`;
  gemma3 GGUFs store RMSNorm weights as 1+w, which we undo; embeddings are tied
  when the file has no `output.weight`.
* Hugging Face fast-tokenizer files (`tokenizer.json`, `tokenizer_config.json`
  with the chat template and BOS/EOS), built from the GGUF metadata with the
  converter in `transformers.integrations.gguf`, no torch needed (models/gguf/tokenizer.py).

The first call converts (seconds to a minute) into a temp folder beside the cache
entry and renames it into place (temps are named after their process; a later
run removes those of killed runs, see `mlxspec.util.tempfiles`); later calls only hash
the GGUF (~1 s per GB) to find the entry.  A truncated or corrupt file raises
`MlxspecError` naming the file and leaves no cache entry.  GGUF has no checksums:
a flipped bit in a weight is only caught if it makes a weight non-finite, or by
`expected_sha256` (catalog files are converted with their pinned hash, see
`mlxspec.models.pinned.fetch.converted`).  Metadata that makes no sense (a head count of 0, a
length that is not a whole number) is a one-line `MlxspecError` naming the key.
On a terminal, conversion shows a progress bar (tensors done / total).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import click
import numpy as np

from ...util import progress, tempfiles
from ...errors import MlxspecError, write_failure
from .reader import _corrupt, _one_line, dequantize, metadata, open_gguf  # noqa: F401 (public here too)
from .storage import Rounding, shard_plan, stored_bytes, to_storage
from .tokenizer import eos_ids, read_tokenizer, tokenizer_files  # noqa: F401  (public here too)
from ...util.paths import cache_dir
from ...util.untrusted import printable, read_json, regular_file

MAX_COUNT = 1 << 24  # no sane size, count or length in GGUF metadata is larger
FORMAT = 2  # of the converted folders (1: float32, 2: float16 matrices); bump it when conversion changes
READABLE_FORMATS = (1, 2)  # cache entries of these formats are used as they are; others are redone
FLOAT32_FORMAT = 1  # what a folder written with float16 storage off is: every tensor float32
MLX_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3_text"}

# GGUF block tensor suffix -> mlx-lm name inside `model.layers.N.`
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma 3 has four norms per block: ffn_norm is the pre-feed-forward one.
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}



def _say(progress: bool, message: str) -> None:
    if progress:
        click.echo(message, err=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def mlx_name(gguf_name: str, arch: str) -> str:
    """mlx-lm parameter name for a GGUF tensor name ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight")."""
    base, _, kind = gguf_name.rpartition(".")
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", base):
        table = GEMMA3_LAYER_NAMES if arch == "gemma3" else LAYER_NAMES
        if m.group(2) in table:
            return f"model.layers.{m.group(1)}.{table[m.group(2)]}.{kind}"
    elif base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{kind}"
    raise MlxspecError(f"unsupported tensor {gguf_name!r} in a {arch} GGUF file")


def model_config(meta: dict, tensors: dict) -> dict:
    """config.json for the mlx-lm model class of this file.  `tensors`: GGUF name -> numpy shape."""
    arch = meta["general.architecture"]
    if arch not in MLX_MODEL_TYPE:
        raise MlxspecError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(MLX_MODEL_TYPE)})")

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise MlxspecError(f"GGUF metadata lacks {arch}.{name}")
        return value

    def count(name, default=None, lo=1):
        """A whole number >= lo from the metadata; anything else is one line naming the key."""
        value = key(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= MAX_COUNT:
            raise MlxspecError(f"GGUF metadata {arch}.{name} is {printable(repr(value), 40)}: "
                               f"expected a whole number from {lo} to {MAX_COUNT}")
        return int(value)

    def real(name, default=None, lo=0.0):
        value = key(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value) \
                or not value > lo:
            raise MlxspecError(f"GGUF metadata {arch}.{name} is {printable(repr(value), 40)}: "
                               f"expected a finite number above {lo:g}")
        return float(value)

    hidden, heads = count("embedding_length"), count("attention.head_count")
    head_dim = count("attention.key_length", hidden // heads)
    kv_heads = count("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise MlxspecError(f"GGUF metadata: {arch}.attention.head_count ({heads}) is not a multiple of "
                           f"{arch}.attention.head_count_kv ({kv_heads})")
    config = {
        "model_type": MLX_MODEL_TYPE[arch],
        "hidden_size": hidden,
        "num_hidden_layers": count("block_count"),
        "intermediate_size": count("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": real("attention.layer_norm_rms_epsilon"),
        "vocab_size": tensors["token_embd.weight"][0],
        "max_position_embeddings": count("context_length"),
        "rope_theta": real("rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    rope_dims = count("rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise MlxspecError(f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": real("rope.scaling.factor")}
    elif scaling != "none":
        raise MlxspecError(f"RoPE scaling {scaling!r} is not supported")
    if arch == "llama":
        config["rope_traditional"] = True  # Q/K rows are permuted for interleaved RoPE
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    elif arch == "qwen2" and head_dim != hidden // heads:
        raise MlxspecError(f"qwen2 with head_dim {head_dim} != hidden/heads is not supported by mlx-lm's qwen2")
    elif arch == "gemma3":
        # As llama.cpp: 10k local RoPE base, 5 sliding layers per global one, and
        # attention scaled by head_dim (hidden/heads for the 27B model, 62 layers).
        config["rope_local_base_freq"] = 10000.0
        config["sliding_window"] = count("attention.sliding_window")
        config["sliding_window_pattern"] = 6
        config["query_pre_attn_scalar"] = hidden // heads if config["num_hidden_layers"] == 62 else head_dim
    return config


def file_type_name(value) -> str | None:
    """"Q4_K_M" for the GGUF's general.file_type (llama.cpp's LlamaFileType), or None."""
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return None


def write_weights(path: Path, reader, arch: str, out: Path, progress_lines: bool,
                  float16: bool = True) -> tuple[int, Rounding]:
    """Dequantise every tensor into safetensors shards under `out` (float16 matrices unless `float16`
    is off); return the bytes written and the rounding.  A bar on a terminal (util/progress.py);
    `progress_lines`: a line per shard as well."""
    shards = shard_plan(reader.tensors, float16=float16)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    weight_map, total, done, rounding = {}, 0, 0, Rounding(float16)
    with progress.bar(f"converting {printable(path.name, 60)}", len(reader.tensors), unit="tensor",
                      show=progress_lines) as bar:
        for name, shard in zip(names, shards):
            done, total = _write_shard(path, arch, out, name, shard, weight_map, bar, done, total, rounding,
                                       float16)
            _say(progress_lines, f"  wrote {name}: {done}/{len(reader.tensors)} tensors, {total / 1e9:.2f} GB")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total, rounding


def _write_shard(path: Path, arch: str, out: Path, name: str, shard, weight_map: dict, bar, done: int, total: int,
                 rounding: Rounding, float16: bool):
    """Dequantise one shard's tensors and save them; returns the updated (tensors done, bytes)."""
    import mlx.core as mx

    arrays = {}
    for t in shard:
        w = dequantize(path, t)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1.0  # the file stores 1 + w; mlx-lm's Gemma RMSNorm adds the 1
        key = mlx_name(t.name, arch)
        stored = to_storage(w, float16)
        rounding.add(w, stored)
        arrays[key] = mx.array(stored)
        weight_map[key] = name
        total += stored.nbytes
        done += 1
        bar.update(1)
        del w, stored
    mx.save_safetensors(str(out / name), arrays, metadata={"format": "mlx"})
    return done, total


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def convert_into(path: Path, out: Path, digest: str, progress: bool = True, float16: bool = True) -> None:
    """Write the mlx-lm model folder for GGUF `path` into the existing empty folder `out`.
    `float16=False`: every tensor float32, a folder of FLOAT32_FORMAT (what mlxspec 0.1 wrote;
    benchmarks/storage_dtype.py compares the two); the cache always stores float16."""
    reader = open_gguf(path)
    try:
        meta = metadata(reader)
        arch = meta["general.architecture"]
    except Exception as e:
        raise _corrupt(path, f"metadata: {_one_line(e)}") from None
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    if "token_embd.weight" not in shapes:
        raise _corrupt(path, "no token_embd.weight tensor")
    try:
        config = model_config(meta, shapes)
        for t in reader.tensors:
            mlx_name(t.name, arch)  # fail on unknown tensors before the slow part
    except MlxspecError as e:
        raise MlxspecError(f"{path}: {e}") from None
    need, free = sum(stored_bytes(s, float16) for s in shapes.values()), shutil.disk_usage(out).free
    if free < need + (256 << 20):
        raise MlxspecError(f"{path}: converting needs {need / 1e9:.1f} GB free in {out.parent}, "
                           f"only {free / 1e9:.1f} GB left")
    _say(progress, f"converting {path.name} ({arch}, {config['num_hidden_layers']} layers, "
                   f"{len(reader.tensors)} tensors) to {'float16' if float16 else 'float32'} MLX weights")

    try:
        tok_json, tok_config = tokenizer_files(meta)
    except MlxspecError:
        raise
    except Exception as e:
        raise MlxspecError(f"{path}: cannot build a tokenizer from its metadata ({_one_line(e)})") from None
    tokens, kinds = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    eos = eos_ids(meta, tokens, kinds)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    config.update(eos_token_id=eos, bos_token_id=None if bos is None else int(bos),
                  torch_dtype="float16" if float16 else "float32")
    config["mlxspec"] = {"source": path.name, "sha256": digest,  # the name is shown on terminals
                         "format": FORMAT if float16 else FLOAT32_FORMAT,
                         "general.name": printable(meta["general.name"]) if "general.name" in meta else None,
                         "file_type": file_type_name(meta.get("general.file_type"))}

    _, rounding = write_weights(path, reader, arch, out, progress, float16)
    config["mlxspec"]["storage"] = rounding.to_dict()
    (out / "tokenizer.json").write_text(tok_json)
    _write_json(out / "tokenizer_config.json", tok_config)
    _write_json(out / "generation_config.json", {"bos_token_id": config["bos_token_id"], "eos_token_id": eos})
    _write_json(out / "config.json", config)  # last: a folder with config.json is complete


def cached_format(folder: Path) -> int | None:
    """The FORMAT a converted folder was written with, or None if it is not one."""
    try:
        return read_json(folder / "config.json", max_bytes=1 << 20)["mlxspec"]["format"]
    except (MlxspecError, KeyError, TypeError):
        return None


class ChecksumMismatch(MlxspecError):
    """The GGUF file's SHA-256 is not the one it was expected to have."""


def convert(gguf_path, progress: bool = True, expected_sha256: str | None = None) -> Path:
    """The cached mlx-lm model folder for a GGUF file, converting it on first use.

    Returns `cache_dir()/models/<sha256 of the file>/`.  Raises `MlxspecError`
    (one line, naming the file) for a missing, truncated or corrupt file or an
    unsupported architecture; a failed conversion leaves no cache entry.  With
    `expected_sha256` (a pinned file), a file with another hash raises
    `ChecksumMismatch` before anything is converted or looked up.
    """
    path = Path(gguf_path).expanduser()
    if not (path.exists() or path.is_symlink()):
        raise MlxspecError(f"{path}: no such GGUF file")
    regular_file(path, "GGUF file")  # a FIFO or /dev/zero would hang or never end
    digest = sha256_file(path)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise ChecksumMismatch(f"{path} is corrupt: its SHA-256 is {digest}, expected {expected_sha256.lower()}; "
                               f"fetch it again")
    final = cache_dir() / "models" / digest
    final.parent.mkdir(parents=True, exist_ok=True)
    tempfiles.remove_stale(final.parent)  # temps of killed conversions
    if cached_format(final) in READABLE_FORMATS:
        return final
    start = time.perf_counter()
    with tempfiles.signals_raise():
        tmp = tempfiles.mkdtemp(final.parent, digest[:16])
        try:
            convert_into(path, tmp, digest, progress)
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            if final.exists() and cached_format(final) not in READABLE_FORMATS:  # e.g. from an older mlxspec
                stale = tempfiles.temp_name(final.parent, f"{digest[:16]}-old")
                os.rename(final, stale)
                shutil.rmtree(stale, ignore_errors=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if cached_format(final) not in READABLE_FORMATS:  # not just another process finishing first
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if (reason := write_failure(e)) is not None:  # a full disk; MLX raises RuntimeError("[write] ...")
                raise MlxspecError(f"{path}: cannot write the converted model to {final.parent}: {reason}; "
                                   "nothing was kept") from e
            raise
    _say(progress, f"converted {path.name} in {time.perf_counter() - start:.1f} s -> {final}")
    return final

