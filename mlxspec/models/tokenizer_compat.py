"""Are a draft and a target tokenizer compatible?

The rules are llama.cpp's (`common_speculative_are_compatible`), made tolerant of
embedding padding:

* same tokenizer type (BPE, Unigram, ...);
* same BOS id and whether BOS is added; same EOS id and whether EOS is added;
* vocabulary sizes within 128 of each other;
* identical token text for every shared id from 5 up (ids 0-4 are control
  tokens whose text differs harmlessly between exports);
* the model embedding tables may be larger than the vocabulary (padding rows),
  but every tokenizer id must have a row in both models.

`check_tokenizers` works on Hugging Face tokenizers (or mlx-lm's wrapper), so the
converter can run it on tokenizer files alone, before any weight is downloaded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from ..errors import MlxspecError

MAX_VOCAB_DIFF = 128
FIRST_CHECKED_ID = 5


class IncompatibleTokenizers(MlxspecError, ValueError):
    """The draft cannot speculate for the target: their tokens mean different things."""


@dataclass
class Compatibility:
    ok: bool
    reason: str = ""
    target_vocab: int = 0
    draft_vocab: int = 0
    checked_ids: int = 0
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _hf(tok):
    """The Hugging Face tokenizer inside mlx-lm's TokenizerWrapper, or `tok`."""
    if type(tok).__name__ == "TokenizerWrapper":
        return tok._tokenizer
    return tok


def tokenizer_kind(tok) -> str:
    tok = _hf(tok)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        return type(backend.model).__name__
    return type(tok).__name__


def _adds(tok, token_id, where):
    if token_id is None:
        return False
    ids = tok.encode("a", add_special_tokens=True)
    return bool(ids) and ids[0 if where == "start" else -1] == token_id


def id_to_text(tok) -> dict[int, str]:
    tok = _hf(tok)
    return {i: t for t, i in tok.get_vocab().items()}


def check_tokenizers(target_tok, draft_tok, target_rows=None, draft_rows=None) -> Compatibility:
    """Compare two tokenizers; `*_rows` are the models' embedding sizes if known."""
    t, d = _hf(target_tok), _hf(draft_tok)
    tv, dv = id_to_text(t), id_to_text(d)
    nt, nd = len(tv), len(dv)
    res = Compatibility(ok=False, target_vocab=nt, draft_vocab=nd)

    kt, kd = tokenizer_kind(t), tokenizer_kind(d)
    if kt != kd:
        res.reason = f"tokenizer types differ: target {kt}, draft {kd}"
        return res
    for name in ("bos", "eos"):
        it, id_ = getattr(t, f"{name}_token_id"), getattr(d, f"{name}_token_id")
        if it != id_:
            res.reason = f"{name.upper()} ids differ: target {it!r}, draft {id_!r}"
            return res
        where = "start" if name == "bos" else "end"
        at, ad = _adds(t, it, where), _adds(d, id_, where)
        if at != ad:
            res.reason = f"target {'adds' if at else 'does not add'} {name.upper()}, draft {'adds' if ad else 'does not'}"
            return res
    if abs(nt - nd) > MAX_VOCAB_DIFF:
        res.reason = f"vocabulary sizes differ by more than {MAX_VOCAB_DIFF}: target {nt}, draft {nd}"
        return res
    shared = min(nt, nd)
    for i in range(FIRST_CHECKED_ID, shared):
        a, b = tv.get(i), dv.get(i)
        if a != b:
            res.reason = f"token {i} differs: target {a!r}, draft {b!r}"
            res.details["first_diff_id"] = i
            return res
    for label, rows, n in (("target", target_rows, nt), ("draft", draft_rows, nd)):
        if rows is not None and rows < max(nt, nd):
            res.reason = f"{label} model has {rows} embedding rows but the tokenizers use ids up to {max(nt, nd) - 1}"
            return res
    res.ok, res.checked_ids = True, max(0, shared - FIRST_CHECKED_ID)
    res.reason = f"compatible: {kt}, {shared} shared tokens identical, same BOS/EOS"
    return res


def require_compatible(target_tok, draft_tok, target_rows=None, draft_rows=None) -> Compatibility:
    res = check_tokenizers(target_tok, draft_tok, target_rows, draft_rows)
    if not res.ok:
        raise IncompatibleTokenizers(f"draft and target tokenizers are incompatible: {res.reason}")
    return res


def tokenizer_facts(tok) -> dict:
    """What `check_tokenizers` compares, in a few values that can be pinned (models/pinned/fetch.py
    keeps them for every catalog model, so a pair can be refused before its files
    are fetched): tokenizer type, BOS/EOS ids, vocabulary size, and a digest of the
    token texts from id FIRST_CHECKED_ID up."""
    t = _hf(tok)
    texts = id_to_text(t)
    n = len(texts)
    blob = json.dumps([texts.get(i) for i in range(FIRST_CHECKED_ID, n)], ensure_ascii=False).encode()
    return {"kind": tokenizer_kind(t), "bos": t.bos_token_id, "eos": t.eos_token_id, "vocab": n,
            "tokens": hashlib.sha256(blob).hexdigest()[:16]}


def facts_disagree(target: dict, draft: dict) -> str | None:
    """Why `check_tokenizers` is bound to refuse the pair these facts describe, or None
    (they agree, or cannot tell).  A fact missing from either side is not compared."""
    def both(key):
        return key in target and key in draft

    for key, label in (("kind", "tokenizer types"), ("bos", "BOS ids"), ("eos", "EOS ids")):
        if both(key) and target[key] != draft[key]:
            return f"{label} differ: target {target[key]!r}, draft {draft[key]!r}"
    if both("vocab") and abs(target["vocab"] - draft["vocab"]) > MAX_VOCAB_DIFF:
        return (f"vocabulary sizes differ by more than {MAX_VOCAB_DIFF}: target {target['vocab']}, "
                f"draft {draft['vocab']}")
    if both("vocab") and both("tokens") and target["vocab"] == draft["vocab"] and target["tokens"] != draft["tokens"]:
        return f"the token texts differ ({target['vocab']} tokens each)"
    return None
