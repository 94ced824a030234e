"""Token ids from outside (API callers, session files, a future HTTP server) are
checked here before any model sees them.

An id the embedding table has no row for does not raise in MLX: on the CPU the
lookup reads past the table and the process dies (SIGSEGV), or it returns
garbage; a negative id fails deep inside with `std::bad_cast`.  So every entry
point passes ids through `validate_token_ids` first: integers only (not bools,
not floats, however whole), 0 <= id < the vocabulary size, where the vocabulary
size is the number of embedding rows every model that will read the ids has
(target and draft: see `vocab_rows`).
"""

from __future__ import annotations

from numbers import Integral

from ..errors import MlxspecError


def _shown(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def token_id_problem(value, vocab_size: int | None, where: str = "") -> str | None:
    """Why `value` is not a usable token id, or None when it is fine: "the token
    id{where} must be an integer, got float 1.5" or "token id 5000{where} is out
    of range for this model's vocabulary (0..299)"."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        return f"the token id{where} must be an integer, got {type(value).__name__} {_shown(value)}"
    value = int(value)
    if value < 0 and vocab_size is None:
        return f"token id {value}{where} is negative"
    if value < 0 or (vocab_size is not None and value >= vocab_size):
        return f"token id {value}{where} is out of range for this model's vocabulary (0..{vocab_size - 1})"
    return None


def validate_token_ids(ids, vocab_size: int | None, what: str = "prompt") -> list[int]:
    """`ids` as a list of plain ints, or a one-line MlxspecError naming the first
    bad id and its position, e.g. "prompt: token id 5000 at position 1 is out of
    range for this model's vocabulary (0..299)".  `vocab_size` None checks the
    types and the sign only.  `what` names the input in the message."""
    if isinstance(ids, (str, bytes, dict)) or not hasattr(ids, "__iter__"):
        raise MlxspecError(f"{what} must be a list of token ids, got {type(ids).__name__}")
    ids = list(ids)
    # The common case in one pass of C-level builtins: plain ints, all in range.
    if all(type(t) is int for t in ids) and (not ids or (min(ids) >= 0 and (vocab_size is None or max(ids) < vocab_size))):
        return ids
    for i, t in enumerate(ids):
        problem = token_id_problem(t, vocab_size, f" at position {i}")
        if problem is not None:
            raise MlxspecError(f"{what}: {problem}")
    return [int(t) for t in ids]


def model_vocab_rows(model) -> int | None:
    """Embedding rows of an mlx-lm model (its `args.vocab_size`, which sized the
    embedding table), or None when the model does not say."""
    for m in (model, getattr(model, "target", None)):  # a LayerSkipModel wraps its target
        args = getattr(m, "args", None)
        for source in (args, getattr(args, "text_config", None)):
            n = source.get("vocab_size") if isinstance(source, dict) else getattr(source, "vocab_size", None)
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                return n
    return None


def vocab_rows(*sizes) -> int | None:
    """The vocabulary every model can embed: the smallest of the known sizes."""
    known = [n for n in sizes if n is not None]
    return min(known) if known else None


def fit_rows(logits, rows: int | None):
    """A draft's logits over exactly the target's `rows` vocabulary rows (None: as
    they are).  Checkpoints pad their tables differently (Qwen2.5-7B has 152064 rows,
    its 0.5B draft 151936): a draft id past the target's table would be fed to the
    target (garbage or SIGSEGV, above), and q must line up with p, column for column,
    for the acceptance rule.  Extra columns are cut; missing ones get -inf (q = 0)."""
    import mlx.core as mx

    n = logits.shape[-1]
    if rows is None or n == rows:
        return logits
    if n > rows:
        return logits[..., :rows]
    pad = mx.full(logits.shape[:-1] + (rows - n,), -mx.inf, dtype=logits.dtype)
    return mx.concatenate([logits, pad], axis=-1)
