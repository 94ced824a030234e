"""Memory budgeting: will a target/draft pair fit on this device?

Everything works on *tensor descriptions* - (dtype, shape) pairs as written in a
safetensors header - so the converter can budget a pair from the Hub before a
single weight byte is downloaded, and the loader can refuse a local pair before
reading it.  When no header is at hand, `estimate_from_config` synthesises the
tensors of a standard decoder from its config.json.

The estimate counts, for target and draft:
  * weights after the chosen quantisation (mlx-lm's rule: every 2-D tensor whose
    last dimension is a multiple of the group size is quantised; the rest stays
    float), at the compute dtype (float32 on the CPU backend);
  * the KV cache at the requested context: attention layers x kv_heads x head_dim
    x 2 (K and V) x context x bytes;
  * for hybrid and state-space models (Qwen3.5/Qwen3-Next, LFM2, Mamba), the
    recurrent layers' state, which does not grow with the context, times the
    checkpoints kept for rollback (core/recurrent.py);
and for the target alone the working buffers of one prefill chunk (the logits
row per token dominates for large vocabularies).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MlxspecError
from .metal_4bit import bits_at_load
from .recurrent_memory import DELTA_NET_TYPES, STATE_COPIES, delta_net_tensors, recurrent_layers, recurrent_state_bytes
from ..util.untrusted import parse_json, printable, regular_file

GiB = 1 << 30
GROUP_SIZE = 64
DEFAULT_CONTEXT = 4096
PREFILL_CHUNK = 512

DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
MAX_HEADER_BYTES = 100 << 20  # a safetensors header past this is a corrupt (or hostile) file

# config.json fields the budget reads: positive ints where present (the nullable ones may be null)
POSITIVE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
NULLABLE_FIELDS = ("num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")
QUANT_FIELDS = ("bits", "group_size")  # of an MLX "quantization" object, positive ints where present


def fmt_bytes(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB"


def fmt_params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.1f} K"


# ---------------------------------------------------------------- tensors


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def quantizable(dtype: str, shape, group_size: int = GROUP_SIZE) -> bool:
    """mlx-lm quantises Linear and Embedding weights whose last dim divides by the group size."""
    return dtype in FLOAT_DTYPES and len(shape) == 2 and shape[-1] % group_size == 0


def tensor_bytes(dtype: str, shape, quantize_bits: int | None = None, float_bytes: int | None = None,
                 group_size: int = GROUP_SIZE) -> int:
    """Bytes one tensor takes at run time.

    Float tensors take `float_bytes` each element (default: their own dtype);
    with `quantize_bits`, quantisable ones take bits/8 per element plus a
    scale and a bias per group.  Already-packed tensors (U32 ...) stay as is."""
    n = numel(shape)
    own = DTYPE_BYTES.get(dtype, 4)
    if dtype not in FLOAT_DTYPES:
        return n * own
    fb = float_bytes or own
    if quantize_bits and quantizable(dtype, shape, group_size):
        return n * quantize_bits // 8 + (n // group_size) * 2 * fb
    return n * fb


def model_bytes(tensors, quantize_bits: int | None = None, float_bytes: int | None = None,
                group_size: int = GROUP_SIZE) -> int:
    """Total run-time bytes of `tensors`, an iterable of (dtype, shape[, name])."""
    return sum(tensor_bytes(t[0], t[1], quantize_bits, float_bytes, group_size) for t in tensors)


def param_count(tensors, packed_bits: int | None = None) -> int:
    """Parameters in `tensors`: packed U32 tensors hold 32/bits parameters per element,
    and quantisation scales/biases (named *.scales / *.biases) are not parameters."""
    total = 0
    for dtype, shape, *name in tensors:
        n = numel(shape)
        if packed_bits and name and name[0].endswith((".scales", ".biases")):
            continue
        if dtype == "U32" and packed_bits:
            n = n * 32 // packed_bits
        total += n
    return total


def params_by_dtype(tensors) -> dict:
    out: dict = {}
    for dtype, shape, *_ in tensors:
        out[dtype] = out.get(dtype, 0) + numel(shape)
    return out


def from_header(header: dict, config: dict | None = None) -> list:
    """(dtype, shape, name) list from a parsed safetensors header (or several merged).

    Drops what mlx-lm drops at load: rotary buffers, and lm_head when the config
    ties it to the embedding."""
    tied = bool(text_config(config or {}).get("tie_word_embeddings", (config or {}).get("tie_word_embeddings")))
    out = []
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        if "rotary_emb.inv_freq" in name or (tied and name.endswith("lm_head.weight")):
            continue
        out.append((info["dtype"], tuple(info["shape"]), name))
    return out


def check_header_length(n: int, where) -> None:
    if n > MAX_HEADER_BYTES:
        raise MlxspecError(f"{where}: safetensors header of {n} bytes is implausible; the file is corrupt, "
                           "re-download or re-convert it")


def parse_header(raw: bytes, where) -> dict:
    try:
        header = parse_json(raw, "the header", MAX_HEADER_BYTES)
    except MlxspecError as e:
        raise MlxspecError(f"{where}: unreadable safetensors header ({e}); the file is corrupt or truncated") from None
    if not isinstance(header, dict):
        raise MlxspecError(f"{where}: the safetensors header is not a JSON object; the file is corrupt")
    return header


def read_local_header(path) -> dict:
    """The JSON header of a local safetensors file (reads only the header bytes, at most
    MAX_HEADER_BYTES of them); a FIFO or device is refused before it is opened."""
    regular_file(path, "weights file")
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise MlxspecError(f"{path}: shorter than a safetensors header; the file is corrupt or truncated")
        (n,) = struct.unpack("<Q", raw)
        check_header_length(n, path)
        return parse_header(f.read(n), path)


def local_tensors(model_dir) -> list:
    """(dtype, shape, name) list of the model*.safetensors in an MLX/HF model folder."""
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    header: dict = {}
    for f in sorted(model_dir.glob("model*.safetensors")):
        header.update(read_local_header(f))
    return from_header(header, config)


def read_config(model_dir) -> dict:
    """A folder's config.json, checked with `check_config`; {} if missing.  Not a regular
    file, too large, too deeply nested or not JSON: a one-line MlxspecError naming it."""
    from .model_files import read_model_config

    return check_config(read_model_config(model_dir, required=False), Path(model_dir) / "config.json")


# ---------------------------------------------------------------- configs


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_config(config, where) -> dict:
    """`config` if the fields the budget and the loader read are sane; otherwise a one-line
    MlxspecError naming `where` (the file) and the field.  Absent fields are left to the loader."""

    def bad(field, v, want):
        return MlxspecError(f"{where}: {field} must be {want}, got {printable(json.dumps(v), 60)}")

    if not isinstance(config, dict):
        raise MlxspecError(f"{where} is not a JSON object (it holds a {type(config).__name__}); "
                           "the model folder is broken")
    tc = config.get("text_config")
    if tc is not None and not isinstance(tc, dict):
        raise bad("text_config", tc, "an object")
    for prefix, c in (("", config), ("text_config.", tc or {})):
        for key in POSITIVE_FIELDS + NULLABLE_FIELDS:
            if key in c and not _positive_int(c[key]) and not (c[key] is None and key in NULLABLE_FIELDS):
                raise bad(prefix + key, c[key], "a positive whole number")
        q = c.get("quantization")
        if q is not None and not (isinstance(q, dict) and all(_positive_int(q.get(k, 1)) for k in QUANT_FIELDS)):
            raise bad(prefix + "quantization", q, "an object with positive whole bits and group_size")
    return config


def text_config(config: dict) -> dict:
    """The language-model part of a config (multimodal configs nest it)."""
    tc = config.get("text_config")
    return {**config, **tc} if isinstance(tc, dict) else config


def head_dim(config: dict) -> int:
    c = text_config(config)
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def kv_heads(config: dict) -> int:
    c = text_config(config)
    return int(c.get("num_key_value_heads") or c["num_attention_heads"])


def kv_cache_bytes(config: dict, context: int, dtype_bytes: int) -> int:
    """Full-attention KV cache: attention layers x kv_heads x head_dim x 2 (K, V) x context x bytes."""
    c = text_config(config)
    layers = int(c["num_hidden_layers"]) - recurrent_layers(c)
    if not layers:
        return 0
    return layers * kv_heads(c) * head_dim(c) * 2 * int(context) * int(dtype_bytes)


def activation_bytes(config: dict, chunk: int = PREFILL_CHUNK, dtype_bytes: int = 4) -> int:
    """Working buffers of one prefill chunk: logits plus the widest activations."""
    c = text_config(config)
    width = int(c["vocab_size"]) + 2 * int(c.get("intermediate_size", 4 * c["hidden_size"])) + 4 * int(c["hidden_size"])
    return chunk * width * dtype_bytes


def estimate_from_config(config: dict, dtype: str = "BF16") -> list:
    """Synthetic (dtype, shape) tensors of a standard decoder (Llama/Qwen/Mistral
    family), for when no safetensors header is available."""
    c = text_config(config)
    if c.get("model_type") in DELTA_NET_TYPES:
        return delta_net_tensors(c, dtype)
    h, v, layers = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    ffn = int(c.get("intermediate_size", 4 * h))
    hd, nq, nkv = head_dim(c), int(c["num_attention_heads"]), kv_heads(c)
    mt = c.get("model_type", "")
    bias = c.get("attention_bias", mt == "qwen2")
    out = [(dtype, (v, h)), (dtype, (h,))]
    if not c.get("tie_word_embeddings", False):
        out.append((dtype, (v, h)))
    layer = [
        (dtype, (nq * hd, h)), (dtype, (nkv * hd, h)), (dtype, (nkv * hd, h)), (dtype, (h, nq * hd)),
        (dtype, (ffn, h)), (dtype, (ffn, h)), (dtype, (h, ffn)), (dtype, (h,)), (dtype, (h,)),
    ]
    if bias:
        layer += [(dtype, (nq * hd,)), (dtype, (nkv * hd,)), (dtype, (nkv * hd,))]
    if mt in ("qwen3",):
        layer += [(dtype, (hd,)), (dtype, (hd,))]
    return out + layer * layers


def source_float_bytes(tensors) -> int:
    """Bytes of the widest float dtype among the tensors (4 if none)."""
    sizes = [DTYPE_BYTES[t[0]] for t in tensors if t[0] in FLOAT_DTYPES]
    return max(sizes) if sizes else 4


# ---------------------------------------------------------------- budget


@dataclass
class Budget:
    """Memory breakdown of a pair against what the device can give it."""

    rows: list  # [(label, bytes)]
    usable: int
    usable_source: str
    context: int
    details: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.rows)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def table(self) -> str:
        width = max(len(label) for label, _ in self.rows + [("usable: " + self.usable_source, 0)])
        lines = [f"  {label:<{width}}  {fmt_bytes(b):>11}" for label, b in self.rows]
        lines.append("  " + "-" * (width + 13))
        lines.append(f"  {'total':<{width}}  {fmt_bytes(self.total):>11}")
        lines.append(f"  {'usable: ' + self.usable_source:<{width}}  {fmt_bytes(self.usable):>11}")
        verdict = "fits" if self.fits else f"does NOT fit (over by {fmt_bytes(self.total - self.usable)})"
        lines.append(f"  -> {verdict}")
        return "\n".join(lines)

    def summary(self) -> str:
        return f"{fmt_bytes(self.total)} needed, {fmt_bytes(self.usable)} usable ({self.usable_source})"

    def to_dict(self) -> dict:
        return {
            "rows": [{"item": label, "bytes": b} for label, b in self.rows],
            "total_bytes": self.total,
            "usable_bytes": self.usable,
            "usable_source": self.usable_source,
            "context": self.context,
            "fits": self.fits,
            **self.details,
        }


def usable_bytes(budget_gb: float | None = None) -> tuple[int, str]:
    """(bytes, where the figure comes from): `budget_gb` GiB, or the device's usable memory."""
    if budget_gb is not None:
        if budget_gb <= 0:
            raise MlxspecError(f"--budget must be a positive number of GiB, got {budget_gb}")
        return int(budget_gb * GiB), f"--budget {budget_gb:g} GiB"
    from ..device import is_gpu, usable_memory_bytes

    src = "Metal recommended working set" if is_gpu() else "CPU: physical RAM minus margin"
    return usable_memory_bytes(), src


def pair_budget(target_config: dict, draft_config: dict | None, target_tensors, draft_tensors=None, *,
                context: int = DEFAULT_CONTEXT, quantize_bits: int | None = None, float_bytes: int | None = None,
                usable: int, usable_source: str, labels=("target", "draft")) -> Budget:
    """Breakdown for a target and an optional draft.

    `quantize_bits`: for both models, or a (target, draft) pair of them (None: unquantised).
    `float_bytes`: the compute width of float tensors (4 on the CPU backend,
    None = keep each tensor's dtype).  The KV cache and buffers use
    `float_bytes`, or the source's float width."""
    rows, details = [], {"quantize_bits": quantize_bits, "float_bytes": float_bytes}
    plain = f"float{8 * float_bytes}" if float_bytes else "source dtype"
    qdesc = f"{quantize_bits}-bit" if isinstance(quantize_bits, int) and quantize_bits else plain
    models = [(labels[0], target_config, list(target_tensors))]
    if draft_config is not None:
        models.append((labels[1], draft_config, list(draft_tensors or [])))
    for i, (label, cfg, tensors) in enumerate(models):
        packed = (text_config(cfg).get("quantization") or {}).get("bits")
        n = param_count(tensors, packed)
        bits = quantize_bits[i] if isinstance(quantize_bits, tuple) else quantize_bits  # (target, draft): each its own
        desc = (f"{bits}-bit" if bits else plain) if isinstance(quantize_bits, tuple) else qdesc
        wdesc = f"{packed}-bit (pre-quantised)" if packed else desc
        rows.append((f"{label} weights ({fmt_params(n)} params, {wdesc})",
                     model_bytes(tensors, None if packed else bits, float_bytes)))
        details[f"{label}_params"] = n
    for label, cfg, tensors in models:
        kvb = float_bytes or source_float_bytes(tensors)
        rows.append((f"{label} KV cache ({context} tokens, {8 * kvb}-bit)", kv_cache_bytes(cfg, context, kvb)))
        state = recurrent_state_bytes(cfg, 4)  # the delta-net / SSM states are kept in float32
        if state:
            copies = STATE_COPIES.get(label, STATE_COPIES["target"])
            rows.append((f"{label} recurrent state ({recurrent_layers(cfg)} layers x {copies} snapshots, "
                         "any context)", state * copies))
    ab = float_bytes or source_float_bytes(models[0][2])
    rows.append((f"{labels[0]} prefill buffers ({PREFILL_CHUNK}-token chunk)", activation_bytes(target_config, PREFILL_CHUNK, ab)))
    return Budget(rows, usable, usable_source, context, details)


def check_pair_fits(target_dir, draft_dir=None, context: int = 2048, budget_bytes: int | None = None) -> Budget:
    """Refuse (MlxspecError) to load local model folders that cannot fit; the loader calls this.

    Weights at the compute dtype (float32 on the CPU backend), KV caches at
    `context` tokens.  Set MLXSPEC_NO_MEMORY_CHECK=1 to skip."""
    budget = folder_budget(target_dir, draft_dir, context, budget_bytes)
    if budget is not None and not budget.fits:
        raise MlxspecError(
            f"this pair needs about {fmt_bytes(budget.total)} at a {context}-token context but only "
            f"{fmt_bytes(budget.usable)} is usable ({budget.usable_source}); "
            "use a quantised pair (`mlxspec convert ... --quantize 4`) or a smaller target "
            "(MLXSPEC_NO_MEMORY_CHECK=1 skips this check)"
        )
    return budget


def folder_budget(target_dir, draft_dir=None, context: int = 2048, budget_bytes: int | None = None,
                  share=None, labels=("target", "draft")) -> Budget | None:
    """The Budget of model folders (None: MLXSPEC_NO_MEMORY_CHECK=1, or a folder the loader will
    report).  `share(tensors, config) -> (tensors, config)`: the part of the target one process
    holds (distributed/memory.py: a rank's shard)."""
    if os.environ.get("MLXSPEC_NO_MEMORY_CHECK"):
        return None
    from ..device import is_gpu

    float_bytes = None if is_gpu() else 4
    tcfg = read_config(target_dir)
    dcfg = read_config(draft_dir) if draft_dir is not None else None
    try:
        tt, tshare = local_tensors(target_dir), tcfg
        if share is not None:
            tt, tshare = share(tt, tcfg)
        dt = local_tensors(draft_dir) if draft_dir is not None else None
        usable, src = usable_bytes() if budget_bytes is None else (budget_bytes, "given budget")
        return pair_budget(tshare, dcfg, tt, dt, context=context, float_bytes=float_bytes, usable=usable,
                           usable_source=src, quantize_bits=(bits_at_load(tcfg), bits_at_load(dcfg)), labels=labels)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None  # unreadable folders are reported by the loader itself
