"""The bytes each token id stands for, from the tokenizer's own vocabulary.

Byte-level BPE (GPT-2, Qwen, SmolLM2, Llama 3): each character of a token's string is
one byte under GPT-2's bytes_to_unicode table.  SentencePiece (Llama 2, Mistral): '▁'
is a space and '<0xNN>' one byte.  Special tokens (added tokens: <|im_end|>, ...) get
None: a constraint never allows them except as the end of the reply.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict:
    """GPT-2's bytes_to_unicode, inverted: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _hf(tokenizer):
    return getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper holds the HF tokenizer


def token_bytes(tokenizer, size: int) -> list:
    """bytes (or None for a special or unknown token) for ids 0..size-1."""
    hf = _hf(tokenizer)
    pieces = hf.convert_ids_to_tokens(list(range(size)))
    special = set(getattr(hf, "all_special_ids", []) or [])
    added = getattr(hf, "added_tokens_decoder", {}) or {}
    special |= {i for i, t in added.items() if getattr(t, "special", True)}
    dec = _byte_decoder()
    byte_level = sum(1 for p in pieces[:2000] if isinstance(p, str) and p and all(c in dec for c in p)) > 0.9 * min(
        2000, sum(1 for p in pieces[:2000] if isinstance(p, str) and p))
    out = []
    for i, p in enumerate(pieces):
        if i in special or not isinstance(p, str) or not p:
            out.append(None)
        elif byte_level:
            out.append(bytes(dec[c] for c in p) if all(c in dec for c in p) else p.encode("utf-8"))
        elif len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            try:
                out.append(bytes([int(p[3:5], 16)]))
            except ValueError:
                out.append(p.encode("utf-8"))
        else:
            out.append(p.replace("▁", " ").encode("utf-8"))
    return out


_TABLES: dict = {}  # id(tokenizer) -> (tokenizer, table): one table per loaded tokenizer


def vocab_bytes(tokenizer, size: int | None = None) -> list:
    """token_bytes for the whole vocabulary, computed once per tokenizer."""
    hit = _TABLES.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        n = size or len(_hf(tokenizer))
        hit = _TABLES[id(tokenizer)] = (tokenizer, token_bytes(tokenizer, n))
    return hit[1]
