"""Tiny random-weight hybrid and state-space models (real mlx_lm.models classes).

qwen3_5 (gated delta-net + attention layers), mamba2 (recurrent only) and lfm2
(short convolutions + attention), plus qwen2 (attention only), all with the
tiny_models tokenizer (300 ids).  Models built with `family(seed)` share their
token embedding and output head, and their layers add a smaller random term on
top: different architectures then agree on the next token often but not always,
so speculation between them has partial acceptance (rollbacks of every length).
lfm2 ties its head to its embedding (a shared one would make it repeat its
input), so it gets its own weights and drafts with a noisy copy of itself.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

import tiny_models

V, H = tiny_models.DEFAULT_VOCAB, 64

CONFIGS = {
    "qwen3_5": dict(
        model_type="qwen3_5", hidden_size=H, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, vocab_size=V, max_position_embeddings=1024,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=False,
        rope_parameters={"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        bos_token_id=1, eos_token_id=2),
    "mamba2": dict(
        model_type="mamba2", num_heads=4, head_dim=32, vocab_size=V, hidden_size=H, intermediate_size=128,
        state_size=16, num_hidden_layers=2, layer_norm_epsilon=1e-5, conv_kernel=4, n_groups=1, use_bias=False,
        use_conv_bias=True, tie_word_embeddings=False, time_step_limit=[0.0, 1e9], time_step_rank="auto",
        bos_token_id=1, eos_token_id=2),
    "lfm2": dict(
        model_type="lfm2", vocab_size=V, hidden_size=H, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, norm_eps=1e-5, conv_bias=False, conv_L_cache=3,
        block_dim=H, block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
        block_ff_dim=128, full_attn_idxs=[1, 3], tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "qwen2": tiny_models.config_for("qwen2", hidden=H),
}
HYBRIDS = ("qwen3_5", "mamba2", "lfm2")


def config(arch: str, vocab_size: int = V) -> dict:
    return {**CONFIGS[arch], "vocab_size": vocab_size}


def build(arch: str, seed: int = 0, family: int | None = 0, layer_scale: float = 0.35, vocab_size: int = V):
    """An mlx_lm model of `arch`.  With `family` set, its embedding and head are
    the family's (shared across architectures) and its layers draw from `seed`."""
    model = tiny_models.build(config(arch, vocab_size), seed=seed, scale=layer_scale)
    if family is not None:
        rng = np.random.default_rng(1000 + family)
        emb = rng.normal(0.0, 1.0, (vocab_size, H)).astype(np.float32)
        head = rng.normal(0.0, 4.0 / np.sqrt(H), (vocab_size, H)).astype(np.float32)
        shared = [(k, mx.array(head if "lm_head" in k else emb)) for k, v in tree_flatten(model.parameters())
                  if v.shape == (vocab_size, H) and ("embed" in k or "lm_head" in k)]
        model.update(tree_unflatten(shared))
        mx.eval(model.parameters())
    return model


def save(path, arch: str, model=None, **kw):
    """A model folder (config.json, weights, the shared tokenizer) for `arch`."""
    cfg = config(arch, kw.get("vocab_size", V))
    model = model if model is not None else build(arch, **kw)
    return tiny_models.save_model_dir(path, "llama", model=model, cfg_overrides=cfg)


def pairs() -> dict:
    """name -> (target, draft): hybrid targets with an attention-only draft, with a
    hybrid draft, and (draft None) with prompt lookup."""
    q35, m2, q2 = build("qwen3_5", seed=0, layer_scale=0.5), build("mamba2", seed=1), build("qwen2", seed=2)
    lfm = build("lfm2", seed=3, family=None, layer_scale=3.0)
    lfm_draft = tiny_models.perturbed(lfm, CONFIGS["lfm2"], noise=0.05, seed=5)
    return {
        "qwen3_5+qwen2": (q35, q2),
        "mamba2+qwen3_5": (m2, build("qwen3_5", seed=0)),
        "lfm2+lfm2": (lfm, lfm_draft),
        "qwen3_5+lookup": (q35, None),
        "mamba2+lookup": (m2, None),
        "lfm2+lookup": (lfm, None),
    }
