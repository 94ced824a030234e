"""`mlxspec pairs`: known-good draft/target pairs, and whether they fit here.

Each model is recorded with its parameter count (from its safetensors) and the
config numbers that size it, so estimates need no network.  Drafts share the
target's tokenizer (same family and generation; embedding padding such as
Qwen2.5 151,936 vs 152,064 rows is tolerated by mlxspec.models.tokenizer_compat).  The figures
use the same mlxspec.models.memory functions as `mlxspec convert`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxspec.models import memory


def _cfg(model_type, hidden, ffn, layers, heads, kv, vocab, tied, head_dim=None):
    return {
        "model_type": model_type, "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
        "tie_word_embeddings": tied, **({"head_dim": head_dim} if head_dim else {}),
    }


# repo -> (parameters, config); parameters as counted in the released safetensors.
_QWEN25 = {
    "0.5B": (494_032_768, _cfg("qwen2", 896, 4864, 24, 14, 2, 151936, True)),
    "1.5B": (1_543_714_304, _cfg("qwen2", 1536, 8960, 28, 12, 2, 151936, True)),
    "3B": (3_085_938_688, _cfg("qwen2", 2048, 11008, 36, 16, 2, 151936, True)),
    "7B": (7_615_616_512, _cfg("qwen2", 3584, 18944, 28, 28, 4, 152064, False)),
    "14B": (14_770_033_664, _cfg("qwen2", 5120, 13824, 48, 40, 8, 152064, False)),
    "32B": (32_763_876_352, _cfg("qwen2", 5120, 27648, 64, 40, 8, 152064, False)),
    "72B": (72_706_203_648, _cfg("qwen2", 8192, 29568, 80, 64, 8, 152064, False)),
}
MODELS = {f"Qwen/Qwen2.5-{size}-Instruct": spec for size, spec in _QWEN25.items()}
MODELS.update({f"Qwen/Qwen2.5-Coder-{size}-Instruct": _QWEN25[size] for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B")})
MODELS.update({
    "Qwen/Qwen3-0.6B": (596_049_920, _cfg("qwen3", 1024, 3072, 28, 16, 8, 151936, True, 128)),
    "Qwen/Qwen3-4B": (4_022_468_096, _cfg("qwen3", 2560, 9728, 36, 32, 8, 151936, True, 128)),
    "Qwen/Qwen3-8B": (8_190_735_360, _cfg("qwen3", 4096, 12288, 36, 32, 8, 151936, False, 128)),
    "Qwen/Qwen3-14B": (14_768_307_200, _cfg("qwen3", 5120, 17408, 40, 40, 8, 151936, False, 128)),
    "Qwen/Qwen3-32B": (32_762_123_264, _cfg("qwen3", 5120, 25600, 64, 64, 8, 151936, False, 128)),
    "meta-llama/Llama-3.2-1B-Instruct": (1_235_814_400, _cfg("llama", 2048, 8192, 16, 32, 8, 128256, True, 64)),
    "meta-llama/Llama-3.2-3B-Instruct": (3_212_749_824, _cfg("llama", 3072, 8192, 28, 24, 8, 128256, True, 128)),
    "meta-llama/Llama-3.1-8B-Instruct": (8_030_261_248, _cfg("llama", 4096, 14336, 32, 32, 8, 128256, False)),
    "meta-llama/Llama-3.3-70B-Instruct": (70_553_706_496, _cfg("llama", 8192, 28672, 80, 64, 8, 128256, False)),
    "HuggingFaceTB/SmolLM2-135M-Instruct": (134_515_008, _cfg("llama", 576, 1536, 30, 9, 3, 49152, True)),
    "HuggingFaceTB/SmolLM2-360M-Instruct": (361_821_120, _cfg("llama", 960, 2560, 32, 15, 5, 49152, True)),
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": (1_711_376_384, _cfg("llama", 2048, 8192, 24, 32, 32, 49152, True)),
})


def _qwen35(hidden, ffn, layers, heads, kv, linear_v_heads, tied):
    """A Qwen3.5 dense text model (gated delta-net + gated attention every 4th layer;
    mlx_lm.models.qwen3_5 keeps the language model and drops the vision tower)."""
    cfg = {**_cfg("qwen3_5_text", hidden, ffn, layers, heads, kv, 248320, tied, 256), "full_attention_interval": 4,
           "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": linear_v_heads,
           "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
    return memory.param_count(memory.estimate_from_config(cfg)), cfg


# Qwen3.5 text configs as published with the models (config.json text_config); their
# parameters are counted from that config, language model only (the released
# safetensors also hold the vision encoder, which mlxspec does not load).
MODELS.update({
    "Qwen/Qwen3.5-0.8B": _qwen35(1024, 3584, 24, 8, 2, 16, True),
    "Qwen/Qwen3.5-2B": _qwen35(2048, 6144, 24, 8, 2, 16, True),
    "Qwen/Qwen3.5-4B": _qwen35(2560, 9216, 32, 16, 4, 32, True),
    "Qwen/Qwen3.5-9B": _qwen35(4096, 12288, 32, 16, 4, 32, False),
    "Qwen/Qwen3.5-27B": _qwen35(5120, 17408, 64, 24, 4, 48, False),
})
# Mac-sized pairs as mlx-community publishes them, already 4-bit affine (group 64, as `mlx_lm.convert -q`):
# nothing to convert, `mlxspec generate --model REPO` after `hf download REPO` (target and draft).  Sized from
# the originals' parameter counts at 4 bits, as the estimate does for a conversion.
MLX4 = "mlx-community/"
_MAC = {
    "Qwen2.5-Coder": ("Qwen/Qwen2.5-Coder-{}-Instruct", "{}-Instruct-4bit", "0.5B", ("3B", "7B", "14B", "32B")),
    "Qwen2.5": ("Qwen/Qwen2.5-{}-Instruct", "{}-Instruct-4bit", "0.5B", ("3B", "7B", "14B", "32B")),
    "Qwen3": ("Qwen/Qwen3-{}", "{}-4bit", "0.6B", ("4B", "8B", "14B", "32B")),  # Qwen3 has no 3B / 7B
}


def _mac_repo(family: str, size: str) -> str:
    return f"{MLX4}{family}-{_MAC[family][1].format(size)}"


MAC_PAIRS = [(_mac_repo(f, t), _mac_repo(f, d)) for f, (_, _, d, ts) in _MAC.items() for t in ts]
for _family, (_original, _, _draft, _targets) in _MAC.items():
    MODELS.update({_mac_repo(_family, s): MODELS[_original.format(s)] for s in (_draft, *_targets)})


def prequantized(repo: str) -> int | None:
    """The bits a catalog repo's weights come in already (None: float, converted or quantised by mlxspec)."""
    return 4 if repo.startswith(MLX4) and repo.endswith("-4bit") else None


GATED = ("meta-llama/",)

PAIRS = [
    *[(f"Qwen/Qwen2.5-{s}-Instruct", "Qwen/Qwen2.5-0.5B-Instruct") for s in ("1.5B", "3B", "7B", "14B", "32B", "72B")],
    *[(f"Qwen/Qwen2.5-Coder-{s}-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct") for s in ("1.5B", "3B", "7B", "14B", "32B")],
    *[(f"Qwen/Qwen3-{s}", "Qwen/Qwen3-0.6B") for s in ("8B", "14B", "32B")],
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    # hybrid (gated delta-net) targets: rollback through state checkpoints (mlxspec/core/recurrent.py)
    *[(f"Qwen/Qwen3.5-{s}", "Qwen/Qwen3.5-0.8B") for s in ("4B", "9B", "27B")],
    *MAC_PAIRS,  # Mac-sized, 4-bit as published
]


@dataclass
class Estimate:
    target: str
    draft: str
    params: tuple  # (target, draft)
    q4: memory.Budget
    f32: memory.Budget

    @property
    def gated(self) -> bool:
        return any(r.startswith(GATED) for r in (self.target, self.draft))


def estimate(target: str, draft: str, context: int, usable: int, source: str) -> Estimate:
    (tp, tc), (dp, dc) = MODELS[target], MODELS[draft]
    tt, dt = memory.estimate_from_config(tc), memory.estimate_from_config(dc)
    kw = dict(context=context, usable=usable, usable_source=source)
    q4 = memory.pair_budget(tc, dc, tt, dt, quantize_bits=4, float_bytes=2, **kw)
    # the CPU backend computes in float32; a 4-bit repo stays 4-bit there (its scales widened)
    f32 = memory.pair_budget(tc, dc, tt, dt, quantize_bits=prequantized(target), float_bytes=4, **kw)
    return Estimate(target, draft, (tp, dp), q4, f32)


def estimates(context: int = memory.DEFAULT_CONTEXT, budget_gb: float | None = None) -> tuple[list, int, str]:
    usable, source = memory.usable_bytes(budget_gb)
    return [estimate(t, d, context, usable, source) for t, d in PAIRS], usable, source


def _short(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def table(rows: list) -> str:
    head = ("target", "draft", "params", "4-bit", "fits", "float32", "fits")
    body = [
        (e.target + (" *" if e.gated else ""), e.draft, f"{_short(e.params[0])}+{_short(e.params[1])}",
         memory.fmt_bytes(e.q4.total), "yes" if e.q4.fits else "no",
         memory.fmt_bytes(e.f32.total), "yes" if e.f32.fits else "no")
        for e in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    right = {2, 3, 5}

    def fmt(r):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, body)])
