"""Tiny random-weight mlx-lm models and a word-level tokenizer, for fast tests.

`make_model(arch, vocab_size, seed)` gives an in-memory mlx_lm model;
`save_model_dir(path, ...)` writes a real model folder in the mlx-lm / Hugging
Face layout (config.json, model.safetensors, tokenizer files with a ChatML chat
template) that `mlxspec.load`, mlx-lm and the Hub converter read like any other.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlxspec  # noqa: F401  (preloads OpenBLAS before mlx.core)
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEFAULT_VOCAB = 300


def config_for(arch="llama", vocab_size=DEFAULT_VOCAB, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, max_pos=1024):
    cfg = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if arch == "qwen2":
        cfg["rope_traditional"] = False
    return cfg


def build(cfg, seed=0, scale=1.0):
    """An mlx_lm model for `cfg`, weights drawn from N(0, (scale/sqrt(fan_in))^2)."""
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))
    rng = np.random.default_rng(seed)

    def init(path_and_value):
        name, v = path_and_value
        if "norm" in name:
            return name, mx.ones(v.shape, dtype=mx.float32)
        fan_in = v.shape[-1] if v.ndim > 1 else 1
        std = scale / np.sqrt(fan_in) if v.ndim > 1 else 0.02
        return name, mx.array(rng.normal(0.0, std, v.shape).astype(np.float32))

    params = dict(map(init, tree_flatten(model.parameters())))
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    return model


def make_model(arch="llama", vocab_size=DEFAULT_VOCAB, seed=0, scale=3.0, **cfg_kw):
    """A tiny model whose logits are peaked enough to make greedy decoding meaningful."""
    return build(config_for(arch, vocab_size, **cfg_kw), seed=seed, scale=scale)


def perturbed(model, cfg, noise=0.05, seed=1):
    """A copy of `model` with relative Gaussian noise on every weight: a draft that
    agrees with the target most of the time, but not always."""
    rng = np.random.default_rng(seed)
    clone = build(cfg, seed=0)
    flat = tree_flatten(model.parameters())
    noisy = [
        (k, v + mx.array(rng.normal(0.0, noise, v.shape).astype(np.float32)) * mx.abs(v).mean())
        for k, v in flat
    ]
    clone.update(tree_unflatten(noisy))
    mx.eval(clone.parameters())
    return clone


QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_tokens():
    """GPT-2's byte-to-unicode alphabet: 256 printable stand-ins for the bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocab_list(vocab_size=None):
    """Specials at ids 0-4, then the 256 byte tokens, then merged pairs of
    common letters up to `vocab_size` (default: no merges)."""
    base = SPECIALS + byte_tokens()
    merges = []
    letters = "etaoinshrdlu"
    for a in "Ġ" + letters:
        for b in letters:
            if vocab_size is not None and len(base) + len(merges) >= vocab_size:
                break
            merges.append((a, b))
    return base + [a + b for a, b in merges][: max(0, (vocab_size or 0) - len(base))], merges


def make_tokenizer(vocab_size=None, eos="</s>", rename=None):
    """A byte-level BPE PreTrainedTokenizerFast (Qwen2-style pre-tokenizer, so
    transformers' Qwen2Tokenizer rebuilds it identically).

    `rename={id: text}` changes token texts (to build incompatible pairs)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = vocab_list(vocab_size)
    merges = merges[: len(vocab) - len(SPECIALS) - 256]
    for i, text in (rename or {}).items():
        vocab[i] = text
    tok = Tokenizer(models.BPE({w: i for i, w in enumerate(vocab)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token=eos, unk_token="<unk>", pad_token="<unk>"
    )
    fast.chat_template = CHATML
    return fast


def save_model_dir(path, arch="llama", vocab_size=DEFAULT_VOCAB, seed=0, model=None, cfg_overrides=None,
                   tokenizer_vocab=None, rename=None, eos="</s>", **cfg_kw):
    """Write a complete model folder; returns its Path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = config_for(arch, vocab_size, **cfg_kw)
    cfg.update(cfg_overrides or {})
    if model is None:
        model = build(cfg, seed=seed, scale=3.0)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    make_tokenizer(tokenizer_vocab or vocab_size, eos=eos, rename=rename).save_pretrained(str(path))
    return path


def copy_with_chat_template(src, dst, template: str):
    """A copy of model folder `src` at `dst` whose tokenizer_config.json carries
    `template` as its chat template (as many Hub models do)."""
    import shutil

    dst = Path(dst)
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return dst


# A ChatML template that refuses a system message, the way Gemma's and Mistral's
# templates do (raise_exception), and trips the Jinja sandbox (SecurityError) on
# a user message that says "peek".
STRICT_CHATML = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if m['content'] == 'peek' %}{{ m.__class__() }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_chatty_pair(root, context=4096, arch="qwen2"):
    """The tiny target and a noisy copy as draft, with EOS made unreachable under greedy
    decoding (its lm_head row is zero: a logit of 0 never beats the best of ~300 random
    logits): a generation runs until max tokens or the context.  Returns (target, draft) dirs."""
    root = Path(root)
    cfg = config_for(arch, max_pos=context)
    target = build(cfg, seed=0, scale=3.0)
    draft = perturbed(target, cfg, noise=0.01, seed=1)
    eos = cfg["eos_token_id"]
    for m in (target, draft):
        w = np.array(m.lm_head.weight)
        w[eos] = 0.0
        m.lm_head.weight = mx.array(w)
    return (save_model_dir(root / "target", arch, model=target, max_pos=context),
            save_model_dir(root / "draft", arch, model=draft, max_pos=context))


def f16_model_dir(path, arch="llama", noise=0.0, seed=1):
    """A model folder whose weights are float16 values held as float32 (as the default
    pair's, converted from float16 GGUF files); `noise`: a perturbed copy (a draft)."""
    from mlx.utils import tree_map

    cfg = config_for(arch)
    model = build(cfg, seed=3, scale=3.0)
    if noise:
        model = perturbed(model, cfg, noise=noise, seed=seed)
    model.update(tree_map(lambda v: v.astype(mx.float16).astype(mx.float32), model.parameters()))
    return save_model_dir(path, arch, model=model)


def loaded_elsewhere(path, env: dict, imports: str, expr: str) -> list[str]:
    """Load a float16-valued llama folder (f16_model_dir) at `path` in a fresh process
    with `env` set, run `imports`, print `expr` (of `m`, the loaded target): its words."""
    import os
    import subprocess
    import sys

    code = (f"import mlxspec; {imports}; "
            f"m = mlxspec.load({str(f16_model_dir(path, 'llama'))!r}, no_draft=True).target; print({expr})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-500:]
    return out.stdout.split()


def check_greedy_packed_pair(pair, prompts=("w1 w2 w3", "w7 w7 w7 w7 w9", "w40 w41")) -> None:
    """Greedy speculative output (trees and chains, 3 drafts) equals plain decoding on a
    pair whose weights go through the kernel's packed calls, and the draft contributed."""
    from mlxspec.cpu import kernel as small_gemm

    for prompt in prompts:
        plain = mlxspec.generate(pair, prompt, drafter="none", max_tokens=24, chat_template=False).tokens
        for tree in (True, False):
            before = small_gemm.packed_calls()
            spec = mlxspec.generate(pair, prompt, max_tokens=24, chat_template=False, tree=tree, num_draft=3)
            assert spec.tokens == plain and small_gemm.packed_calls() > before
            assert spec.stats.draft_accepted > 0
