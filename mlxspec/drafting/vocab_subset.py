"""A cheaper draft head (FR-Spec, Zhao et al. 2025): the draft scores only the N
most frequent tokens.

On Qwen2.5-Coder-0.5B the LM head is 136 M of 494 M parameters: a quarter of
every draft step scores tokens that are almost never proposed.  With a subset S
of the vocabulary the draft's logits are computed for S only; q is the draft's
distribution renormalised over S (zero elsewhere).  Exact speculative sampling
needs only that q is what the drafted token was drawn from, so the output is
still exactly the target's; greedy output is unchanged because the target
checks every token (a token outside S is simply never proposed).

The frequencies come from a real corpus that every Python installation carries
offline: the standard library's own source (about 12 MB of Python and English
docstrings and comments, test suites excluded) and the installed packages'
descriptions (their Markdown READMEs: prose and fenced code, which chat answers
use and .py files never do).  It suits the default code pair and needs no
download.  The tokens the chat template itself writes are always in the subset.
The subset is half the corpus's most frequent tokens and half the lowest ids (BPE's
merge order, a frequency ranking of the tokenizer's own training text).  Counts
are computed once per tokenizer, cached under the mlxspec home, and
`mlxspec convert` writes them into pair folders (`vocab_freq.json`).  A table
that does not match the tokenizer (size or hash) is refused.

The pruned head is a view of the draft model (as layer skipping uses): the
model's own `__call__` runs, only its output projection is replaced by the rows
of S, so no architecture is re-implemented and quantised heads stay quantised.
Where the draft's other weights are int8 (cpu/draft_weights.py), so are the rows of
S: a tied 16-bit head of 65536 rows is ~117 MB a draft step would stream, a
quarter of the step's bytes; as int8 it is half that.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sysconfig
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import cpu
from ..errors import MlxspecError
from ..util.untrusted import first_line, notice, read_json
from ..arch.surgery import View

DEFAULT_SIZE = 65536  # --draft-vocab default: on the default pair, no acceptance lost, -19 % draft step (README)
FILE_NAME = "vocab_freq.json"
FORMAT = 2
CORPUS_BYTES = 12_000_000
STORED_RANKS = 65536  # how many ranked ids a table keeps


def tokenizer_hash(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    blob = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def corpus_files(limit: int = CORPUS_BYTES) -> list[Path]:
    """The standard library's Python sources (test suites excluded), then the
    installed packages' descriptions (`*.dist-info/METADATA`: Markdown READMEs,
    prose with fenced code blocks), up to `limit` bytes of each."""
    std = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for f in sorted(std.rglob("*.py")):
        rel = str(f.relative_to(std))
        if "site-packages" in rel or "test" in rel.split(os.sep)[0] or "/test" in rel:
            continue
        files.append(f)
        total += f.stat().st_size
        if total >= limit:
            break
    total = 0
    for f in sorted(Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info/METADATA")):
        files.append(f)
        total += f.stat().st_size
        if total >= limit:
            break
    return files


def template_tokens(tokenizer) -> list[int]:
    """The ids a chat template itself writes (role markers, separators): always drafted."""
    try:
        msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! ```python\nprint(1)\n```"}]
        return sorted(set(tokenizer.apply_chat_template(msgs, tokenize=True)))
    except Exception:  # no template, or one that refuses this conversation: nothing to add
        return []


def count_tokens(tokenizer, files: list[Path]) -> Counter:
    counts: Counter = Counter()
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx_lm's wrapper around the HF tokenizer
    fast = getattr(hf, "backend_tokenizer", None)  # the Rust tokenizer: batched, no length warnings
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    if fast is not None:
        for enc in fast.encode_batch(texts, add_special_tokens=False):
            counts.update(enc.ids)
    else:
        for text in texts:
            counts.update(hf.encode(text, add_special_tokens=False))
    return counts


def _table(tokenizer, counts: Counter, corpus: str) -> dict:
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:STORED_RANKS]
    return {"format": FORMAT, "tokenizer_sha256": tokenizer_hash(tokenizer), "vocab_size": len(tokenizer.get_vocab()),
            "corpus": corpus, "ranked": ranked}


def check_table(table: dict, tokenizer, where: str) -> list[int]:
    """The ranked ids of `table`, after checking that it belongs to `tokenizer`."""
    try:
        if table.get("format") != FORMAT:
            raise ValueError(f"format {table.get('format')!r}")
        ranked = [int(t) for t in table["ranked"]]
        size, digest = int(table["vocab_size"]), str(table["tokenizer_sha256"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise MlxspecError(f"{where} is not a token frequency table ({e}); delete it or re-run `mlxspec convert`") from e
    mine_size, mine = len(tokenizer.get_vocab()), tokenizer_hash(tokenizer)
    if size != mine_size or digest != mine:
        raise MlxspecError(f"{where} was made for another tokenizer ({size} tokens, hash {digest[:12]}) than "
                           f"the draft's ({mine_size} tokens, hash {mine[:12]}); delete it or use --draft-vocab full")
    if any(not 0 <= t < mine_size for t in ranked):
        raise MlxspecError(f"{where} names token ids outside the tokenizer's {mine_size}; delete it")
    return ranked


def build_table(tokenizer, say=None) -> dict:
    files = corpus_files()
    if not files:
        raise MlxspecError("no Python standard library sources found to count token frequencies; use --draft-vocab full")
    if say is not None:
        say(f"counting token frequencies in the Python standard library and package READMEs "
            f"({len(files)} files, once per tokenizer)")
    corpus = (f"python{sysconfig.get_python_version()} stdlib + package descriptions, "
              f"{sum(f.stat().st_size for f in files)} bytes")
    return _table(tokenizer, count_tokens(tokenizer, files), corpus)


def write_table(table: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(table))
        os.replace(tmp, path)
    except BaseException:  # a full disk: no temp file left behind
        tmp.unlink(missing_ok=True)
        raise


def cached_table(tokenizer, say=None) -> dict:
    """The tokenizer's frequency table from the mlxspec cache, counted on first use."""
    from ..util.paths import cache_dir

    path = cache_dir() / "vocab" / f"{tokenizer_hash(tokenizer)}.json"
    if path.exists() or path.is_symlink():
        try:
            table = read_json(path, str(path))
            check_table(table, tokenizer, str(path))
            return table
        except MlxspecError as e:  # a damaged cache entry (even 100,000 brackets deep): counted again
            notice(f"ignoring the vocabulary cache {path} ({first_line(e)}); counting again")
            with contextlib.suppress(OSError):
                if not path.is_dir():
                    path.unlink()
    table = build_table(tokenizer, say)
    try:
        write_table(table, path)
    except OSError:
        pass
    return table


def ranked_tokens(tokenizer, pair_dir: Path | None = None, say=None) -> list[int]:
    """Token ids by corpus frequency: from the pair folder's table, else the cache."""
    if pair_dir is not None and ((pair_dir / FILE_NAME).exists() or (pair_dir / FILE_NAME).is_symlink()):
        path = pair_dir / FILE_NAME
        try:
            table = read_json(path, "it")
        except MlxspecError as e:
            raise MlxspecError(f"{path} is unreadable ({e}); delete it or re-run `mlxspec convert`") from None
        return check_table(table, tokenizer, str(path))
    return [int(t) for t in cached_table(tokenizer, say)["ranked"]]  # checked when read, or just counted


def choose_ids(ranked: list[int], size: int, always=(), vocab_size: int = 0) -> list[int]:
    """`size` ids: `always` (EOS, special and chat-template tokens), then two
    frequency estimates in equal parts -- the corpus's most frequent ids, and the
    lowest ids (a BPE vocabulary lists its merges roughly by frequency in the
    tokenizer's own, much larger, training text: this catches common tokens our
    corpus lacks, such as whitespace runs that PEP 8 code never has)."""
    chosen = dict.fromkeys(always)
    by_id = iter(range(vocab_size))
    by_corpus = iter(ranked)
    for source in (by_corpus, by_id):
        quota = len(chosen) + (size - len(chosen)) // 2 if source is by_corpus else size
        for t in source:
            if len(chosen) >= quota:
                break
            chosen.setdefault(t)
    for t in list(ranked) + list(range(vocab_size)):  # a small vocabulary or corpus: fill from either
        if len(chosen) >= size:
            break
        chosen.setdefault(t)
    return sorted(chosen)


# -- the pruned head --------------------------------------------------------------

class _Rows:
    """The rows `ids` of a (possibly quantised) embedding or linear layer, applied
    as an output projection; for an embedding, calling it still embeds with the
    full table."""

    def __init__(self, layer, ids: mx.array, embedding: bool):
        self.layer, self.embedding = layer, embedding
        self.packed = None
        if cpu.is_packed(layer):  # its columns, packed as it is
            self.packed = layer.take_columns(np.array(ids))
            self.params = {"bias": layer["bias"][ids]} if "bias" in layer else {}
        elif "wt" in layer:  # a TransposedLinear (cpu/blas_layout.py): its columns
            self.params = {"wt": mx.take(layer["wt"], ids, axis=1)}
            if "bias" in layer:
                self.params["bias"] = layer["bias"][ids]
        else:
            self.params = {k: layer[k][ids] for k in ("weight", "scales", "biases", "bias") if k in layer}
        self.quantized = "scales" in self.params
        if not self.quantized and "weight" in self.params and self.params["weight"].dtype == mx.float32 \
                and cpu.rows_for_blas():  # the rows, stored as BLAS likes them (cpu/blas_layout.py)
            self.params["wt"] = mx.contiguous(self.params.pop("weight").T)
        mx.eval(self.params)  # now: MLX streams are per thread, and replies may run on another one
        if "wt" in self.params:  # packed for the small-batch kernel, when it is loaded (cpu/packed_weights.py)
            self.packed = _packed_rows(self.params["wt"])
            if self.packed is not None:
                del self.params["wt"]

    def __getattr__(self, name):
        return getattr(self.__dict__["layer"], name)

    def project(self, x):
        p = self.params
        if self.quantized:
            out = mx.quantized_matmul(x, p["weight"], scales=p["scales"], biases=p.get("biases"), transpose=True,
                                      group_size=self.layer.group_size, bits=self.layer.bits,
                                      mode=getattr(self.layer, "mode", "affine"))
        elif self.packed is not None:
            out = self.packed(x)
        elif "wt" in p:
            out = x @ p["wt"]
        else:
            out = x @ p["weight"].T
        return out + p["bias"] if "bias" in p and not self.embedding else out

    def as_linear(self, x):
        return self.project(x)

    def __call__(self, x):
        return self.layer(x) if self.embedding else self.project(x)


_packed_rows = cpu.pack_rows  # the kernel's rows (cpu/__init__.py)


class _Joined:
    """Two `_Rows` of one layer side by side: the subset's own rows (packed once, shared
    by every SubsetHead of the layer) and the conversation's extra ones (few, cheap)."""

    def __init__(self, first: _Rows, second: _Rows):
        self.first, self.second = first, second

    def __getattr__(self, name):
        return getattr(self.__dict__["first"], name)

    def project(self, x):
        return mx.concatenate([self.first.project(x), self.second.project(x)], axis=-1)

    def as_linear(self, x):
        return self.project(x)

    def __call__(self, x):
        return self.first.layer(x) if self.first.embedding else self.project(x)


_SHARED_ROWS: list = []  # [(layer, ids tuple, _Rows)]: the last few subsets built, so decoders share them
SHARED_ROWS_KEPT = 2


def _shared_rows(layer, ids: list[int], embedding: bool) -> _Rows:
    key = (tuple(ids), cpu.draft_rows_rounded())
    for entry in _SHARED_ROWS:
        if entry[0] is layer and entry[1] == key:
            return entry[2]
    rows = _Rows(layer, mx.array(ids, dtype=mx.uint32), embedding)
    _SHARED_ROWS.insert(0, (layer, key, rows))
    del _SHARED_ROWS[SHARED_ROWS_KEPT:]
    return rows


class SubsetHead:
    """A draft model whose output is the logits of the tokens `ids` only.  `include`
    widens the subset by the tokens of a conversation (its names and words are
    likely to come back), so what the prompt says is never undraftable.  The rows of
    `ids` are built once per draft model and shared; a conversation's extra tokens
    are a second, small projection, so widening does not rebuild the large one."""

    def __init__(self, model, ids: list[int], vocab_size: int):
        self.base, self.vocab_size = model, vocab_size
        inner = getattr(model, "model", None)
        head = getattr(model, "lm_head", None)
        if head is not None and ("weight" in head or "wt" in head or cpu.is_packed(head)):
            self._kind = "lm_head"
        elif inner is not None and getattr(inner, "embed_tokens", None) is not None:
            self._kind = "embed_tokens"
        else:
            raise MlxspecError(f"cannot prune the head of {type(model).__module__}: no lm_head or tied "
                               "embed_tokens; use --draft-vocab full")
        self._own = sorted(set(ids))
        self._build([])
        width = self.model(mx.array([[0]])).shape[-1]  # the model's own forward must use the pruned rows
        if width != self.size:
            raise MlxspecError(f"cannot prune the head of {type(model).__module__}: its forward does not go "
                               "through lm_head / embed_tokens.as_linear; use --draft-vocab full")

    def _build(self, extra: list[int]):
        """The view for the subset's own ids, then `extra` (sorted, disjoint from them)."""
        ids = self._own + extra
        self._extra = extra
        self._set = set(ids)
        self.ids = mx.array(ids, dtype=mx.uint32)
        self.size = len(ids)
        model = self.base
        layer = model.lm_head if self._kind == "lm_head" else model.model.embed_tokens
        embedding = self._kind != "lm_head"
        rows = _shared_rows(layer, self._own, embedding)
        self.fmt = rows.packed.fmt if rows.packed is not None else "mlx"  # how the rows are stored (cost keys)
        if extra:
            rows = _Joined(rows, _Rows(layer, mx.array(extra, dtype=mx.uint32), embedding))
        if self._kind == "lm_head":
            self.model = View(model, lm_head=rows)
        else:
            self.model = View(model, model=View(model.model, embed_tokens=rows))

    def include(self, tokens) -> bool:
        """Add `tokens` to the subset; True when it changed (then `model` is a new view)."""
        new = {t for t in tokens if 0 <= t < self.vocab_size} - self._set
        if new:
            self._build(sorted(set(self._extra) | new))
        return bool(new)

    def scatter(self, logits: mx.array) -> mx.array:
        """(T, N) subset logits -> (T, V) with -inf outside the subset."""
        full = mx.full((logits.shape[0], self.vocab_size), -mx.inf, dtype=logits.dtype)
        idx = mx.broadcast_to(self.ids[None, :], logits.shape)
        return mx.put_along_axis(full, idx, logits, axis=-1)
