"""Drafters: where the guesses come from.

The speculative loop does not care how tokens are proposed.  A drafter gets the
token history and a number k, and returns up to k tokens plus, for sampling,
the distributions q it drew them from (processed by the same `process_logits`
as the target).  A drafter that proposes deterministically returns q=None.

* `ModelDrafter`: a small model with its own KV cache (optionally stopping early
  when its top probability falls below `p_min`, as llama.cpp's --draft-p-min).
* `PromptLookupDrafter`: n-gram matches against the prompt and the text so far;
  deterministic proposals (q=None), no second model.
* `LayerSkipDrafter`: self-speculation; the target drafts for itself with some of
  its layers skipped, sharing its weights.

`api.make_drafter(pair, name)` looks names up in `DRAFTERS` (name -> factory
taking the pair, p_min and max_kv_size); nothing else in this module is reachable by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .. import cpu
from ..core.cache import ModelState, common_prefix
from ..core.coupled import Coupling
from ..costs.draft_length import Round
from ..errors import MlxspecError
from ..core.sampling import SamplingParams, process_logits, sample
from ..core.token_ids import fit_rows
from ..arch.surgery import View


@dataclass
class Proposal:
    tokens: list[int]
    q: mx.array | None = None  # (len(tokens), V) probabilities; None = deterministic (or greedy)
    confidence: list = field(default_factory=list)  # the draft's top probability at each position (None: lookup)

    def __len__(self):
        return len(self.tokens)


EMPTY = Proposal([])


class Drafter:
    """Interface.  `propose` must not change what the target sees; `prefill` lets
    a drafter with a cache process the prompt up front (counted as prompt time).
    `rnd` (draft_length.Round) decides token by token whether to keep drafting."""

    name = "none"
    max_k = 0
    relative_cost = 0.0  # cost of one draft step relative to a plain target step (an estimate)
    uses_draft_model = False

    def prefill(self, history: list[int], should_stop=None) -> None:
        pass

    def propose(self, history: list[int], k: int, params: SamplingParams, key, rnd=None) -> Proposal:
        return EMPTY

    def reset(self) -> None:
        pass


class ModelDrafter(Drafter):
    """A small model with its own KV cache.  With a vocabulary subset (FR-Spec,
    drafting/vocab_subset.py) its head scores only the subset's tokens: q is then the
    draft's distribution over the subset (zero elsewhere), which is exactly what
    the tokens were drawn from, so the acceptance rule stays exact."""

    name = "draft-model"
    max_k = 16
    relative_cost = 0.3  # api.make_drafter sets the pair's parameter ratio
    uses_draft_model = True

    def __init__(self, model, p_min: float = 0.0, subset=None, max_kv_size: int | None = None):
        self.subset = subset  # vocab_subset.SubsetHead or None
        self.state = ModelState(subset.model if subset is not None else model, max_kv_size)
        cpu.attach_compiled(self.state)  # the draft's forwards, compiled where they can be
        self.p_min = p_min
        self.rows = None  # the target's vocabulary rows, which q must span (set by SpeculativeDecoder.use)
        self.cost_key = self.name if subset is None else f"{self.name}/vocab{subset.size}/{subset.fmt}"

    def prefill(self, history, should_stop=None):
        if self.subset is not None and self.subset.include(history):
            self.state.model = self.subset.model  # the conversation's tokens can be drafted too
        self.state.prefill(history, should_stop)

    def reset(self):
        self.state.reset()

    def full_logits(self, logits):
        """Logits over the target's vocabulary (`rows`): a pruned head's scattered, a
        padded table's cut or filled (token_ids.fit_rows)."""
        if self.subset is not None:
            logits = self.subset.scatter(logits)
        return fit_rows(logits, self.rows)

    def _distribution(self, logits, params, context):
        """(log q over the full vocabulary or None, token, log q(token)) for one step."""
        sub = self.subset
        if sub is not None and params.greedy and not params.adjusts_logits:
            lp = cpu.normalise(logits)  # over the subset only
            j = mx.argmax(lp, axis=-1)
            return None, sub.ids[j], mx.take_along_axis(lp, j[:, None], axis=-1)[:, 0]
        lp = process_logits(self.full_logits(logits), params, context)
        return lp, None, None

    def propose(self, history, k, params, key, rnd=None):
        if k <= 0:
            return EMPTY
        rnd = rnd if rnd is not None else Round(None, k)
        state = self.state
        pending = state.sync(history)
        coupling = key if isinstance(key, Coupling) else None  # coupled sampling: argmax(log q + g_position)
        keys = mx.random.split(key, k) if key is not None and coupling is None else [None] * k
        x = mx.array(pending, dtype=mx.uint32)
        tokens, qs, confs, forwards = [], [], [], 0
        for i in range(k):
            if not rnd.more():
                break
            logits = state.forward(x)[-1:]  # lazy input: ids recorded below
            forwards += 1
            context = [history + tokens] if params.uses_context else None
            lp, tok, lq = self._distribution(logits, params, context)
            if lp is not None and coupling is not None:
                tok = coupling.choose(lp, [len(history) + len(tokens)])  # the same g_t the target uses
                lq = mx.take_along_axis(lp, tok[:, None], axis=-1)[:, 0]  # q(x): any rule is exact when coupled
            elif lp is not None:
                tok = sample(lp, params, keys[i])
                lq = lp.max(axis=-1)
            mx.eval(tok, lq)
            # The confidence is the draft's TOP probability, known before its token is
            # drawn: a refusal that looked at the drawn token's own q(x) would bias the
            # proposals (rejection sampling needs x ~ q whenever a position is drafted).
            conf = float(mx.exp(lq).item())
            if conf != conf:
                raise MlxspecError("the draft model produced NaN logits: its weights are corrupt or overflow in "
                                   "this dtype; re-convert or re-download it, or use --no-draft")
            if (self.p_min > 0 and conf < self.p_min) or not rnd.offer(conf):
                break  # not worth verifying: sync() trims the extra position next round
            tokens.append(int(tok.item()))
            confs.append(conf)
            if lp is not None:
                qs.append(lp)
            x = tok
        if forwards:
            state.tokens.extend(pending + tokens[: forwards - 1])
        if not tokens:
            return EMPTY
        q = None if params.greedy or coupling is not None else cpu.probabilities(mx.concatenate(qs, axis=0))
        return Proposal(tokens, q, confs)


# ---------------------------------------------------------------------------
# Prompt lookup: n-gram matching against the prompt and the text so far.


class PromptLookupDrafter(Drafter):
    """Propose the tokens that followed the most recent earlier occurrence of the
    last n tokens (n from `max_ngram` down to `min_ngram`).  No second model:
    pays on input-grounded work (editing code, summarising, quoting a document).
    min_ngram = 2 by default: single-token matches are mostly wrong (SmolLM2-135M,
    greedy, adaptive k: writing code, a quarter of the drafts kept with unigrams
    against a third without, same speed; a code-edit answer ~10 % faster without).

    Proposals are deterministic (q=None: the acceptance rule treats them as
    one-hot, which keeps sampling exact).  An incremental index maps every
    n-gram to the last position where it ended with at least one token after it,
    so a round costs O(new tokens), not O(history)."""

    name = "prompt-lookup"
    max_k = 16
    relative_cost = 0.01
    proposes_lookup = True  # the auto policy prices its proposals as lookup's (costs/draft_length.py)

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.reset()

    def reset(self):
        self._tokens: list[int] = []  # the history the index describes
        self._index: dict[tuple, int] = {}  # n-gram -> end position of its latest indexed occurrence

    def prefill(self, history, should_stop=None):
        self._sync(history)

    def _sync(self, history: list[int]):
        n_same = common_prefix(self._tokens, history)
        if n_same < len(self._tokens):  # a different history (new conversation, edited turn): rebuild
            self.reset()
            n_same = 0
        start = max(0, len(self._tokens) - 1)  # n-grams ending at len-1 now have a follower
        self._tokens.extend(history[n_same:])
        toks, index = self._tokens, self._index
        for end in range(start, len(toks) - 1):
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                index[tuple(toks[end - n + 1: end + 1])] = end

    def lookup(self, history: list[int], k: int, path: list[int] = ()) -> list[int]:
        """k tokens continuing `history` + `path`, or [] when no n-gram matches.  `path`:
        tokens proposed after the history (a draft tree's node), matched but not
        indexed, so that looking up after one node and then another costs no rebuild.
        What followed the match is copied; where that copy reaches the end of the
        text it repeats with the match's period (text that loops, "a b c a b c a b" ->
        "c a b c ...")."""
        self._sync(history)
        toks, path = self._tokens, list(path)
        tail = toks[-self.max_ngram:] + path
        for n in range(min(self.max_ngram, len(toks) + len(path)), self.min_ngram - 1, -1):
            end = self._index.get(tuple(tail[-n:]))
            if end is not None:
                start = end + 1
                period = len(toks) + len(path) - start
                return [toks[j] if j < len(toks) else path[j - len(toks)]
                        for j in (start + i % period for i in range(k))]
        return []

    def propose(self, history, k, params, key, rnd=None):
        if k <= 0:
            return EMPTY
        rnd = rnd if rnd is not None else Round(None, k)
        out = self.lookup(history, k)
        if not out:
            rnd.stop_reason = "no-match"
        kept = 0
        while kept < len(out) and rnd.more(self.relative_cost, lookup=True) and rnd.offer(None, self.relative_cost):
            kept += 1
        return Proposal(out[:kept], None, [None] * kept) if kept else EMPTY


def make_lookup(pair, p_min: float = 0.0, max_ngram: int = 3, min_ngram: int = 2,
                max_kv_size: int | None = None) -> PromptLookupDrafter:
    """`--drafter lookup`: prompt lookup; needs no draft model (and proposes
    deterministically, so `p_min` does not apply) and keeps no KV cache."""
    return PromptLookupDrafter(max_ngram, min_ngram)


# ---------------------------------------------------------------------------
# Self-speculation: the target drafts for itself with some of its layers skipped.


class _SkippedLayer:
    """Stands in for a skipped decoder layer: the hidden state passes through
    unchanged.  Its KV cache still advances (with 1-wide dummy keys), so every
    cache keeps the target's offsets, masks, trimming and rotation semantics.
    Attributes the model's loop reads (use_sliding, ...) come from the real layer."""

    def __init__(self, layer):
        self.__dict__["_layer"] = layer

    def __getattr__(self, name):
        return getattr(self.__dict__["_layer"], name)

    def __call__(self, h, mask=None, cache=None, *args, **kwargs):
        if cache is not None and hasattr(cache, "update_and_fetch"):  # a recurrent state just stays as it is
            B, T = h.shape[:2]
            dummy = mx.zeros((B, 1, T, 1), dtype=h.dtype)
            cache.update_and_fetch(dummy, dummy)
        return h


def skip_layout(num_layers: int, layout: str = "middle") -> list[int]:
    """Which layers the draft keeps:
    * "middle" (default): all but a contiguous block of L/4 layers starting at L/3,
      where layers are most redundant (measured by top-1 agreement with the full
      model on text: skipping 6 of Qwen2.5-Coder-0.5B's 24 layers there keeps
      52 %, skipping every other layer 4 %, early exit after L/2 layers 0 %);
    * "first-half": the first L/2 layers (early exit);
    * "every-other": layers 0, 2, 4, ... plus the last one."""
    L = num_layers
    if layout == "middle":
        lo, n = L // 3, max(1, L // 4)
        return [i for i in range(L) if not lo <= i < lo + n] or [0]
    if layout == "first-half":
        return list(range(max(1, L // 2)))
    if layout == "every-other":
        return sorted(set(range(0, L, 2)) | {L - 1})
    raise ValueError(f"unknown layer layout {layout!r} (middle, first-half, every-other)")


class LayerSkipModel:
    """The target with only the layers in `keep` active, sharing its weights.

    A view of `model.model` whose `layers` list has the skipped layers replaced by
    pass-throughs, called through the mlx_lm classes' own __call__; needs the usual
    mlx_lm layout (model.model.layers, layers called as layer(h, mask, cache))."""

    def __init__(self, model, keep):
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if not isinstance(layers, list) or not layers:
            raise MlxspecError(
                f"layer skipping needs an mlx_lm model with model.layers; {type(model).__name__} has none")
        keep = sorted(set(keep))
        if not keep or keep[0] < 0 or keep[-1] >= len(layers):
            raise ValueError(f"kept layers {keep} out of range for {len(layers)} layers")
        self.target = model
        self.keep = keep
        self.num_layers = len(layers)
        kept = set(keep)
        view_layers = [layer if i in kept else _SkippedLayer(layer) for i, layer in enumerate(layers)]
        overrides = {"layers": view_layers}
        if hasattr(inner, "pipeline_layers"):  # qwen2 & co. iterate over pipeline_layers
            overrides["pipeline_layers"] = view_layers[inner.start_idx: inner.end_idx]
        self._model = View(model, model=View(inner, **overrides))

    @property
    def layers(self):
        return self._model.model.layers

    def make_cache(self):
        return make_prompt_cache(self.target)

    def __call__(self, inputs, cache=None, **kwargs):
        return type(self.target).__call__(self._model, inputs, cache=cache, **kwargs)


class LayerSkipDrafter(ModelDrafter):
    """Self-speculation: the target runs with some layers skipped to draft for itself
    (no second model, no extra weights: only the draft's own KV cache).  The draft
    loop, sampling from the processed distribution q, and p_min are ModelDrafter's."""

    name = "layer-skip"

    def __init__(self, target_model, keep=None, layout: str = "middle", p_min: float = 0.0,
                 max_kv_size: int | None = None):
        n = len(getattr(getattr(target_model, "model", None), "layers", None) or [None])
        super().__init__(LayerSkipModel(target_model, keep if keep is not None else skip_layout(n, layout)), p_min,
                         max_kv_size=max_kv_size)
        self.name = f"layer-skip({len(self.state.model.keep)}/{n} layers)"
        self.relative_cost = len(self.state.model.keep) / n


def make_layerskip(pair, p_min: float = 0.0, layout: str = "middle",
                   max_kv_size: int | None = None) -> LayerSkipDrafter:
    """`--drafter layerskip`: self-speculation with the target's own layers (its own
    KV cache, bounded like the target's by `max_kv_size`)."""
    return LayerSkipDrafter(pair.target, layout=layout, p_min=p_min, max_kv_size=max_kv_size)


# The drafters `--drafter NAME` / `make_drafter(pair, NAME)` can build besides "model" and "none".
DRAFTERS = {
    "lookup": make_lookup,
    "prompt-lookup": make_lookup,
    "layerskip": make_layerskip,
    "layer-skip": make_layerskip,
}
