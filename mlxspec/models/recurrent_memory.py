"""Hybrid and state-space models' memory: which layers keep a recurrent state
instead of a KV cache (Qwen3.5 / Qwen3-Next gated delta-net, LFM2 short
convolutions, Mamba), and how big that state is.  It does not grow with the
context; rollback (core/recurrent.py) keeps a few snapshots of it.  Read from
config.json alone, so `mlxspec convert` can budget a Hub pair before download.
"""

from __future__ import annotations


def _text_config(config: dict) -> dict:
    tc = config.get("text_config")
    return {**config, **tc} if isinstance(tc, dict) else config


RECURRENT_LAYER_TYPES = {"linear_attention", "conv", "mamba", "mamba2", "ssm", "recurrent"}
DELTA_NET_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
STATE_COPIES = {"target": 4, "draft": 16}  # live state + checkpoints: a verify pass, anchors; a draft's steps


def recurrent_layers(config: dict) -> int:
    """How many layers keep a recurrent state instead of a KV cache."""
    c = _text_config(config)
    n = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    mt = c.get("model_type", "")
    if isinstance(types, list) and types:
        return sum(t in RECURRENT_LAYER_TYPES for t in types)
    if mt in DELTA_NET_TYPES:
        return n - n // int(c.get("full_attention_interval") or 4)
    if mt in ("lfm2", "lfm2_moe") and isinstance(c.get("full_attn_idxs"), list):
        return n - len(c["full_attn_idxs"])
    if mt in ("mamba", "mamba2", "falcon_mamba"):
        return n
    return 0


def recurrent_state_bytes(config: dict, dtype_bytes: int) -> int:
    """One copy of all recurrent layers' state (conv window + SSM / delta-net state);
    0 for architectures this does not know (their state is then not budgeted)."""
    c = _text_config(config)
    mt = c.get("model_type", "")
    g = lambda k, d=0: int(c.get(k) or d)  # noqa: E731
    if mt in DELTA_NET_TYPES:
        kd, vd = g("linear_num_key_heads") * g("linear_key_head_dim"), g("linear_num_value_heads") * g("linear_value_head_dim")
        per_layer = (g("linear_conv_kernel_dim", 4) - 1) * (2 * kd + vd) + vd * g("linear_key_head_dim")
    elif mt == "mamba2":
        per_layer = ((g("conv_kernel", 4) - 1) * (g("intermediate_size") + 2 * g("n_groups", 1) * g("state_size"))
                     + g("num_heads") * g("head_dim") * g("state_size"))
    elif mt in ("mamba", "falcon_mamba"):
        per_layer = (g("conv_kernel", 4) - 1 + g("state_size")) * g("intermediate_size")
    elif mt in ("lfm2", "lfm2_moe"):
        per_layer = (g("conv_L_cache", 3) - 1) * g("hidden_size")
    else:
        return 0
    return recurrent_layers(c) * per_layer * int(dtype_bytes)


def delta_net_tensors(config: dict, dtype: str = "BF16") -> list:
    """Synthetic (dtype, shape) tensors of a Qwen3.5 / Qwen3-Next dense text model
    (mlx_lm.models.qwen3_5): gated delta-net layers, every `full_attention_interval`-th
    layer gated attention (q_proj twice as wide: query and output gate)."""
    c = _text_config(config)
    g = lambda k, d=0: int(c.get(k) or d)  # noqa: E731
    h, v, n, ffn = g("hidden_size"), g("vocab_size"), g("num_hidden_layers"), g("intermediate_size")
    nq, nkv = g("num_attention_heads"), g("num_key_value_heads", c.get("num_attention_heads"))
    hd = g("head_dim", h // nq)
    hk, dk, hv, dv = (g("linear_num_key_heads"), g("linear_key_head_dim"), g("linear_num_value_heads"),
                      g("linear_value_head_dim"))
    kd, vd, conv = hk * dk, hv * dv, g("linear_conv_kernel_dim", 4)
    out = [(dtype, (v, h)), (dtype, (h,))] + ([] if c.get("tie_word_embeddings") else [(dtype, (v, h))])
    common = [(dtype, (ffn, h)), (dtype, (ffn, h)), (dtype, (h, ffn)), (dtype, (h,)), (dtype, (h,))]
    linear = [(dtype, (2 * kd + vd, h)), (dtype, (vd, h)), (dtype, (hv, h)), (dtype, (hv, h)),
              (dtype, (2 * kd + vd, conv, 1)), (dtype, (hv,)), (dtype, (hv,)), (dtype, (dv,)), (dtype, (h, vd))]
    attention = [(dtype, (2 * nq * hd, h)), (dtype, (nkv * hd, h)), (dtype, (nkv * hd, h)), (dtype, (h, nq * hd)),
                 (dtype, (hd,)), (dtype, (hd,))]
    n_linear = recurrent_layers(c)
    return out + (common + linear) * n_linear + (common + attention) * (n - n_linear)
