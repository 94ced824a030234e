"""The Python API: generate to a string, or stream chunks with stats at the end.

    import mlxspec
    pair = mlxspec.load()                       # the default pair
    out = mlxspec.generate(pair, "def quicksort(xs):", max_tokens=64)
    print(out.text, out.stats.acceptance_rate)

    stream = mlxspec.stream_generate(pair, [{"role": "user", "content": "Hi"}], temp=0.7)
    for chunk in stream:
        print(chunk.text, end="", flush=True)  # chunk.token, chunk.from_draft
    print(stream.stats.summary())
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

from .costs.draft_length import FixedK
from .drafting.drafters import DRAFTERS, Drafter, ModelDrafter
from .errors import MlxspecError
from .core.options import check_all
from .drafting.registry import check_drafter
from .core.sampling import SamplingParams
from .decoder import SpeculativeDecoder, check_context
from .core.stats import GenerationStats
from .core.token_ids import validate_token_ids


@dataclass
class Chunk:
    text: str  # the new text (may be empty while a multi-byte character is incomplete)
    token: int
    from_draft: bool
    logprobs: tuple | None = None  # asked for: (log p(token), [(id, log p), ...] the top ones), p the target's


@dataclass
class Result:
    text: str
    tokens: list
    stats: GenerationStats


class ChatTemplateError(MlxspecError):
    """The model's chat template raised (raise_exception(...), a Jinja sandbox
    SecurityError, a bug in the template): nothing was generated."""


def apply_chat_template(tokenizer, messages: list[dict], tokenize: bool, tools: list | None = None):
    """`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`, with
    whatever the template raises (it is code that came with the model) turned
    into a one-line ChatTemplateError.  `tools`: OpenAI's tool list, for templates that take it."""
    try:
        kw = {"tools": tools} if tools else {}
        out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=tokenize, **kw)
    except Exception as e:
        msg = " ".join(str(e).split())
        if type(e).__name__ == "TemplateError" and msg:  # raise_exception("...") in the template: its own words
            detail = f": {msg}"
        else:
            detail = f" ({type(e).__name__}{': ' + msg if msg else ''})"
        raise ChatTemplateError(f"the chat template cannot render this conversation{detail}") from e
    if tokenize:
        return list(out["input_ids"] if isinstance(out, dict) else out)
    return out


def encode_prompt(tokenizer, prompt, chat_template: bool | None = None, vocab_size: int | None = None,
                  tools: list | None = None) -> list[int]:
    """A str (raw text, or chat-templated if chat_template=True), a list of chat
    messages ({"role", "content"} dicts, always templated), or token ids (ints,
    0 <= id < `vocab_size` when given: see core/token_ids.py)."""
    if isinstance(prompt, str):
        if chat_template and getattr(tokenizer, "chat_template", None):
            return apply_chat_template(tokenizer, [{"role": "user", "content": prompt}], tokenize=True)
        bos = getattr(tokenizer, "bos_token", None)
        ids = list(tokenizer.encode(prompt, add_special_tokens=not (bos and prompt.startswith(bos))))
        if not ids:
            raise MlxspecError("the prompt is empty: give some text for the model to continue")
        return ids
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        if not getattr(tokenizer, "chat_template", None):
            raise MlxspecError("this tokenizer has no chat template: pass a plain text prompt instead of messages")
        return apply_chat_template(tokenizer, prompt, tokenize=True, tools=tools)
    if isinstance(prompt, (list, tuple)) and prompt:
        return validate_token_ids(prompt, vocab_size)
    raise MlxspecError("prompt must be text, a list of chat messages, or a non-empty list of token ids")


def parameter_count(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(model.parameters()))


def make_subset(pair, size) -> object | None:
    """The draft's pruned head (drafting/vocab_subset.py) for `size`: an int N, 'full'/0 (off)
    or None (the default N, when the vocabulary is larger than it and the model's
    head can be pruned; otherwise the full head)."""
    from .drafting import vocab_subset
    from .core.token_ids import model_vocab_rows

    if size in ("full", 0):
        return None
    n = vocab_subset.DEFAULT_SIZE if size is None else int(size)
    rows = model_vocab_rows(pair.draft)
    if rows is None or n >= rows:
        return None
    try:
        known = getattr(pair, "subset_ids", None)
        ids = known.get(n) if known is not None else None
        if ids is None:  # the table is read (or counted) once per pair, not once per decoder
            ranked = vocab_subset.ranked_tokens(pair.tokenizer, getattr(pair, "pair_dir", None), say=_say)
            specials = (list(pair.eos_token_ids) + list(getattr(pair.tokenizer, "all_special_ids", []) or [])
                        + vocab_subset.template_tokens(pair.tokenizer))
            ids = vocab_subset.choose_ids(ranked, n, [t for t in specials if 0 <= t < rows], rows)
            if known is not None:
                known[n] = ids
        return vocab_subset.SubsetHead(pair.draft, ids, rows)
    except MlxspecError:
        if size is None:  # the default: a model whose head cannot be pruned keeps its full head
            return None
        raise


def _say(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def make_drafter(pair, drafter: str | Drafter | None = None, p_min: float = 0.0, draft_vocab=None,
                 max_kv_size: int | None = None) -> Drafter:
    """'model' (the pair's draft, the default when there is one), 'hybrid' (prompt
    lookup, then the draft model), 'lookup' (prompt lookup), 'layerskip'
    (self-speculation), 'none', or a Drafter (used as it is).  `draft_vocab`: the draft
    head's vocabulary subset size (None: the default; 'full': the whole vocabulary).
    `max_kv_size`: bound a draft model's KV cache as the target's (core/kv_window.py)."""
    if isinstance(drafter, Drafter):
        return drafter
    check_all(p_min=p_min, draft_vocab=draft_vocab, max_kv_size=max_kv_size)
    if drafter is None:
        drafter = "model" if pair.draft is not None else "none"
    if drafter == "none":
        return Drafter()
    if drafter in ("model", "hybrid"):
        if pair.draft is None:
            raise MlxspecError("no draft model loaded: pass --draft MODEL, or use --no-draft")
        d = ModelDrafter(pair.draft, p_min=p_min, subset=make_subset(pair, draft_vocab), max_kv_size=max_kv_size)
        d.relative_cost = parameter_count(pair.draft) / parameter_count(pair.target)
        if drafter == "hybrid":
            from .drafting.drafters import PromptLookupDrafter
            from .drafting.hybrid import HybridDrafter

            return HybridDrafter(PromptLookupDrafter(), d)
        return d
    check_drafter(drafter)  # the CLI's rule (core/options.py): "unknown drafter ...: choose one of ..."
    return DRAFTERS[drafter](pair, p_min=p_min, max_kv_size=max_kv_size)


_calibrating = threading.Lock()


def make_policy(num_draft, drafter: Drafter, pair=None, *, cost=None, num_draft_max=None, cost_profile=None):
    """An int k: draft exactly k per round (`FixedK`).  None or 'auto' (the default,
    for every drafter): `PerToken`, which drafts token by token while it pays per
    the pair's calibrated cost model (costs/cost_model.py; measured once and cached), up
    to `num_draft_max` tokens, and falls back to plain decoding when drafting is
    predicted not to pay.  `cost`: a CostModel to use instead of the calibrated one.
    `cost_profile`: decide by another machine's costs instead (costs/profiles.py,
    docs/profiles.md): a shipped profile's name ('apple-m3plus-7b', ...), a profile file,
    or 'this-machine' (the calibration, the default)."""
    if cost is None and cost_profile is not None:
        from .costs.profiles import profile_cost

        cost = profile_cost(cost_profile, drafter)  # a bad name or file: one line, even for a fixed k
    from .costs import calibration as calibration_cache, cost_model
    from .costs.draft_length import DEFAULT_MAX_K, PerToken

    check_all(num_draft=num_draft, num_draft_max=num_draft_max)  # Session's settings too
    if not drafter.max_k:
        return FixedK(0)
    if num_draft is None or num_draft == "auto":
        cap = min(drafter.max_k, DEFAULT_MAX_K if num_draft_max is None else int(num_draft_max))
        if cap <= 0:
            return FixedK(0)  # --num-draft-max 0: plain decoding
        if cost is None:
            if pair is not None:
                with _calibrating:  # threads starting together measure a pair once, not side by side
                    cost = calibration_cache.for_decoder(pair, drafter)
            else:
                cost = cost_model.assumed(drafter.relative_cost)
        from .core.recurrent import has_recurrent

        return PerToken(cost, cap, lookup=getattr(drafter, "proposes_lookup", False),
                        model=getattr(drafter, "uses_draft_model", False),
                        refeed=pair is not None and has_recurrent(pair.target))
    return FixedK(int(num_draft))


def make_decoder(pair, drafter=None, num_draft=None, p_min: float = 0.0, *, draft_vocab=None,
                 num_draft_max=None, cost=None, tree: bool | None = None,
                 max_kv_size: int | None = None, cost_profile=None, kv_bits: int | None = None,
                 kv_group_size: int = 64) -> SpeculativeDecoder:
    """`tree`: None (the default) verifies draft trees where the pair supports them
    (trees/round.py; their size follows the cost model, so they stay chains where
    width does not pay), False verifies chains.  `max_kv_size`: bound the target's
    and the draft's KV caches to that many positions (mlx-lm's --max-kv-size: the
    first 4 and the latest ones; core/kv_window.py); the context limit stays the model's.
    `kv_bits` (4 or 8), `kv_group_size` (32, 64, 128): quantize the target's KV cache after
    the prompt, as mlx-lm's --kv-bits with --quantized-kv-start 0 (core/cache.quantize)."""
    check_all(max_kv_size=max_kv_size, kv_bits=kv_bits, kv_group_size=kv_group_size)
    d = make_drafter(pair, drafter, p_min, draft_vocab, max_kv_size)
    policy = make_policy(num_draft, d, pair, cost=cost, num_draft_max=num_draft_max, cost_profile=cost_profile)
    return SpeculativeDecoder(pair.target, d, policy, pair.context_length, pair.vocab_size,
                              _target_name(pair), tree=tree, max_kv_size=max_kv_size,
                              kv_bits=kv_bits, kv_group_size=kv_group_size)


def _target_name(pair) -> str:
    try:
        from .models.loading import model_name

        return f"the target model {model_name(pair.target_path, pair.target_config)!r}"
    except Exception:
        return "the target model"


class GenerationStream:
    """Iterate for Chunks; afterwards `.stats`, `.tokens`, `.text` hold the results.
    Closing the stream early (break, `close()`) leaves the decoder's caches
    consistent with the tokens produced so far."""

    def __init__(self, decoder: SpeculativeDecoder, tokenizer, history: list[int], params: SamplingParams,
                 max_tokens: int, should_stop=None, eos_token_ids=None, logprobs: int | None = None):
        """`logprobs` (0-20): each Chunk carries its token's log-probability and the top `logprobs`
        alternatives under the target's processed distribution (read off the verify pass)."""
        self.stats = GenerationStats()
        self.tokens: list[int] = []
        self.text = ""
        self._tokenizer = tokenizer
        check_context(history, decoder.context_length)
        decoder.check_tokens(history)
        eos = tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids
        self._history, self._start = history, len(history)
        self._gen = decoder.generate(history, params, max_tokens, eos, self.stats, should_stop, logprobs)
        self._it = self._run()

    def _run(self) -> Iterator[Chunk]:
        detok = self._tokenizer.detokenizer
        for token, from_draft, *info in self._gen:
            detok.add_token(token)
            self.tokens.append(token)
            seg = detok.last_segment
            self.text += seg
            yield Chunk(seg, token, from_draft, info[0] if info else None)
        detok.finalize()
        tail = detok.last_segment
        if tail:
            self.text += tail
            yield Chunk(tail, -1, False)

    def __iter__(self):
        return self

    def __next__(self) -> Chunk:
        return next(self._it)

    def close(self):
        """Stop early.  `.tokens` and `.text` then hold every token generated, as the
        stats count them: an interrupt (Ctrl-C) between the decoder handing out a token
        and this stream recording it would otherwise leave it out of them."""
        self._it.close()
        self._gen.close()
        generated = self._history[self._start:]
        if len(generated) > len(self.tokens):
            self.tokens = list(generated)
            self.text = self._tokenizer.decode(self.tokens)


def _params(temp=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0,
            repetition_context_size=20, seed=None, sampling=None, presence_penalty=0.0,
            frequency_penalty=0.0, logit_bias=()) -> SamplingParams:
    return SamplingParams(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                          repetition_penalty=repetition_penalty,
                          repetition_context_size=repetition_context_size, seed=seed, sampling=sampling,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                          logit_bias=logit_bias)


def stream_generate(pair, prompt, *, max_tokens: int = 256, drafter=None, num_draft=None,
                    p_min: float = 0.0, chat_template: bool | None = None, decoder=None,
                    draft_vocab=None, num_draft_max=None, tree: bool | None = None,
                    max_kv_size: int | None = None, cost_profile=None, kv_bits: int | None = None,
                    kv_group_size: int = 64, logprobs: int | None = None, **sampling) -> GenerationStream:
    """Stream a generation.  `sampling`: temp, top_p, top_k, min_p,
    repetition_penalty, repetition_context_size, presence_penalty, frequency_penalty (OpenAI's,
    -2..2, over the generated tokens), logit_bias ({token id: bias}), seed, sampling ("coupled": the plain run's
    text for a seed, token for token, whatever the draft -- the default with a seed;
    "rejection": speculative rejection sampling, the default without one).  `logprobs` (0-20): each
    Chunk's `.logprobs` is (log p(token), [(id, log p), ...] the top `logprobs`) under the target's
    processed distribution, read off the verify pass.  `tree`, `max_kv_size`,
    `kv_bits`, `kv_group_size`: see
    make_decoder (a `decoder` given keeps its own)."""
    check_all(max_tokens=max_tokens, num_draft=num_draft, num_draft_max=num_draft_max, p_min=p_min,
              draft_vocab=draft_vocab, max_kv_size=max_kv_size, kv_bits=kv_bits,
              kv_group_size=kv_group_size)  # core/options.py's rules, as the CLI's: one line
    params = _params(**sampling)
    history = encode_prompt(pair.tokenizer, prompt, chat_template, pair.vocab_size)  # bad input fails first
    decoder = decoder or make_decoder(pair, drafter, num_draft, p_min, draft_vocab=draft_vocab,
                                      num_draft_max=num_draft_max, tree=tree, max_kv_size=max_kv_size,
                                      cost_profile=cost_profile, kv_bits=kv_bits, kv_group_size=kv_group_size)
    return GenerationStream(decoder, pair.tokenizer, history, params, max_tokens, logprobs=logprobs)


def generate(pair, prompt, **kwargs) -> Result:
    """Generate to a string.  Same arguments as `stream_generate`."""
    stream = stream_generate(pair, prompt, **kwargs)
    for _ in stream:
        pass
    return Result(stream.text, stream.tokens, stream.stats)
