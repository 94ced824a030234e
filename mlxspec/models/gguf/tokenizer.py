"""The tokenizer a GGUF file describes, as Hugging Face tokenizer files.

`tokenizer_files` builds `tokenizer.json` and `tokenizer_config.json` from the
GGUF metadata with the converter in `transformers.integrations.gguf` (no torch
needed); `read_tokenizer` gives the same tokenizer as an object, from the
metadata alone, so a pair can be checked before anything is converted
(models/pair_check.py); `eos_ids` lists the ids generation stops on.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import MlxspecError

# Tokens llama.cpp treats as end of generation when the vocabulary has them as control tokens.
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|end_of_text|>"}
CONTROL = 3


def eos_ids(meta: dict, tokens: list, token_types: list) -> list[int]:
    """EOS first, then the other end-of-generation ids llama.cpp would stop on."""
    ids = [meta.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
    ids += [i for i, (t, kind) in enumerate(zip(tokens, token_types)) if kind == CONTROL and t in EOG_TEXTS]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def tokenizer_files(meta: dict) -> tuple[str, dict]:
    """(tokenizer.json text, tokenizer_config dict) for the tokenizer described in `meta`."""
    from tokenizers import pre_tokenizers, processors
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    arch = meta["general.architecture"]
    spec = {
        name: meta[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    tokens = spec["tokens"]
    backend, _ = convert_gguf_tokenizer(arch, spec)
    if spec.get("pre_tokenizer_type") == "smollm":
        # llama.cpp's `smollm`: every digit on its own, then GPT-2's byte-level split.
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )

    def token_id(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return int(i) if i is not None and 0 <= int(i) < len(tokens) else None

    def token(key):
        i = token_id(key)
        return None if i is None else tokens[i]

    # Bake BOS/EOS adding into tokenizer.json, so every reader of the file agrees.
    bos, eos = token("bos_token_id"), token("eos_token_id")
    add_bos = bos is not None and bool(meta.get("tokenizer.ggml.add_bos_token", spec.get("tokenizer_type") == "llama"))
    add_eos = eos is not None and bool(meta.get("tokenizer.ggml.add_eos_token", False))
    single = ([bos] if add_bos else []) + ["$A"] + ([eos] if add_eos else [])
    pair = single + [("$B:1" if t == "$A" else t) for t in single]
    specials = ([(bos, token_id("bos_token_id"))] if add_bos else []) + (
        [(eos, token_id("eos_token_id"))] if add_eos and eos != bos else []
    )
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 0)) or None,
    }
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return backend.to_str(), {k: v for k, v in config.items() if v is not None}


def read_tokenizer(path: Path):
    """The Hugging Face tokenizer a conversion of GGUF `path` would write, built from
    its metadata alone (no weight is read or converted): for checking a pair first."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    from .reader import _one_line, metadata, open_gguf

    reader = open_gguf(path)
    try:
        meta = metadata(reader)
        tok_json, tok_config = tokenizer_files(meta)
    except MlxspecError:
        raise
    except Exception as e:
        raise MlxspecError(f"{path}: cannot build a tokenizer from its metadata ({_one_line(e)})") from None
    specials = {k: tok_config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in tok_config}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok_json), **specials)
