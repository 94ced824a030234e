"""The speculative loop.

One round:
  1. the draft-length policy gives a cap k (0 = a plain target step) and a
     `Round` that decides token by token whether drafting more pays;
  2. the drafter proposes up to k tokens (the draft model runs small steps with
     its own KV cache, asking the round before and after each one);
  3. the target scores the pending token plus all drafts -- k+1 positions -- in
     ONE forward pass; logits processing, the acceptance rule and sampling of
     the next token are part of the same lazy graph, evaluated once;
  4. the leading accepted drafts and the target's next token are emitted: every
     round yields at least one token, the target's own;
  5. nothing is rolled back eagerly: the next round's `sync(history)` trims both
     caches to what the history really is (see core/cache.py).

Plain decoding is the same loop with k = 0, so comparisons are like for like.

Threads: a decoder holds one generation's caches, so it runs one generation at a
time -- a second thread's `generate` on a decoder another thread is generating with
is refused in one line.  Decoders of one loaded pair share only its models, which
no call patches (tree positions and masks travel with the call: trees/attention.py),
so any number of threads may each generate with their own decoder
(`mlxspec.generate` builds one per call; tests/test_threads.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Iterator

import mlx.core as mx

from .core.acceptance import leading_accepted, near_ties, verify, verify_coupled
from .core.coupled import Coupling, new_coupling
from .core.cache import ModelState
from .costs.cost_model import assumed
from .costs.draft_length import DEFAULT_MAX_K, FixedK, PerToken, Round
from .drafting.drafters import EMPTY, Drafter, ModelDrafter, PromptLookupDrafter
from .errors import MlxspecError
from .core.sampling import SamplingParams, greedy_scores, lazy_normalised, new_key, process_logits, token_logprobs
from .core.stats import GenerationStats
from .core.token_ids import model_vocab_rows, validate_token_ids, vocab_rows
from .trees.round import NOTED_KINDS, NoTrees, run_tree_round, tree_unsupported



_thread_end = threading.local()


class _ClearStreams:
    """Dropped when its thread ends: MLX (0.32) gives each thread its own streams and
    asks that a thread clear them before it ends (`mx.clear_streams`), or the process
    may abort when it exits ("terminate called without an active exception")."""

    def __del__(self):
        clear = getattr(mx, "clear_streams", None)
        if clear is not None:
            try:
                clear()
            except Exception:
                pass


def clear_streams_when_thread_ends() -> None:
    """Have MLX's streams of the calling thread (not the main one) cleared when it ends."""
    if threading.current_thread() is not threading.main_thread() and not hasattr(_thread_end, "mark"):
        _thread_end.mark = _ClearStreams()


def check_context(history: list[int], limit: int | None):
    if limit is not None and len(history) >= limit:
        raise MlxspecError(
            f"prompt is {len(history)} tokens but the model's context is {limit}: shorten it or start a new conversation"
        )


def _draft_state(drafter) -> ModelState | None:
    """The ModelState a drafter's forwards run on (a hybrid drafter's model part's), or None."""
    for d in (drafter, getattr(drafter, "model", None)):
        if isinstance(getattr(d, "state", None), ModelState):
            return d.state
    return None


class SpeculativeDecoder:
    """Owns the target's cache, a drafter and a draft-length policy.  Reusable
    across generations: the caches keep whatever prefix the next history shares."""

    def __init__(self, target_model, drafter: Drafter | None = None, policy=None,
                 context_length: int | None = None, vocab_size: int | None = None,
                 target_name: str = "the target model", tree: bool | None = None,
                 max_kv_size: int | None = None, kv_bits: int | None = None, kv_group_size: int = 64):
        """`vocab_size`: ids the caller's models can all embed (`Pair.vocab_size`);
        the decoder also never accepts more than its target and drafter embed.
        `max_kv_size`: bound the target's KV cache to that many positions (core/kv_window.py;
        the drafter bounds its own, see api.make_drafter).  `kv_bits`, `kv_group_size`: quantize
        the target's KV cache as mlx-lm's `--kv-bits`, from position 0 (core/cache.quantized)."""
        if kv_bits is not None and max_kv_size is not None:
            raise MlxspecError("kv_bits (--kv-bits) and max_kv_size (--max-kv-size) do not go together: mlx-lm "
                               "cannot quantize a bounded KV cache either")
        self.target = ModelState(target_model, max_kv_size, None if kv_bits is None else (kv_bits, kv_group_size))
        self.vocab_size = vocab_size
        self.target_name = target_name
        drafter = drafter or Drafter()
        if policy is None:  # the API's default, auto, with the drafter's own cost estimate (the API calibrates)
            d = drafter
            policy = PerToken(assumed(d.relative_cost), min(DEFAULT_MAX_K, d.max_k), lookup=getattr(
                d, "proposes_lookup", False), model=d.uses_draft_model) if d.max_k else FixedK(0)
        self.use(drafter, policy)
        self.context_length = context_length
        self.tree = tree  # None (the default) or True: verify trees where they work; False: chains
        self._tree_for = None  # the (drafter, policy) that tree_note was worked out for
        self.lookup = PromptLookupDrafter()  # in tree rounds, its continuations join the trees
        self._guard = threading.Lock()
        self._user: tuple | None = None  # (thread, token) of the generation running now
        self._round_logprobs = None  # the last chain round's processed log-probabilities

    def _claim(self) -> object:
        """Take the decoder for one generation: refused in one line while another live
        thread's generation holds it (its caches are one conversation's); a generation
        this thread left unfinished gives way.  The token `_release` wants."""
        me = threading.current_thread()
        with self._guard:
            if self._user is not None and self._user[0] is not me and self._user[0].is_alive():
                raise MlxspecError(
                    "this decoder is generating in another thread: give each thread its own decoder or Session "
                    "(mlxspec.generate(pair, ...) makes one per call), or wait for that generation to end")
            token = object()
            self._user = (me, token)
        return token

    def _release(self, token: object) -> None:
        with self._guard:
            if self._user is not None and self._user[1] is token:
                self._user = None

    def use(self, drafter: Drafter, policy) -> None:
        """Draft with `drafter` under `policy` from the next round on (Session and serve swap them
        per conversation or request); trees follow (tree_note is worked out per pair)."""
        self.drafter, self.policy = drafter, policy
        for d in (drafter, getattr(drafter, "model", None)):  # a hybrid drafter's model part too
            if isinstance(d, ModelDrafter):
                d.rows = model_vocab_rows(self.target.model)  # q spans the target's rows (token_ids.fit_rows)
        if getattr(policy, "cost", None) is not None:  # how many re-fed positions ride along (core/recurrent.py)
            from .costs.cost_model import merge_limit

            self.target.merge_limit = merge_limit(policy.cost)

    @property
    def tree_note(self) -> NoTrees | None:
        """Why rounds verify chains with the current drafter and policy (None: trees)."""
        if self.tree is False:
            return None
        if self._tree_for != (self.drafter, self.policy):  # Session and serve swap them
            self._tree_for = (self.drafter, self.policy)
            self._tree_why = tree_unsupported(self.target, self.drafter, self.policy)
        return self._tree_why

    @property
    def trees(self) -> bool:
        return self.tree is not False and self.tree_note is None

    def reset(self):
        self.target.reset()
        self.drafter.reset()
        self.lookup.reset()

    @property
    def token_limit(self) -> int | None:
        """Token ids must be below this: every model involved has an embedding row for them."""
        draft_model = getattr(getattr(self.drafter, "state", None), "model", None)
        return vocab_rows(self.vocab_size, model_vocab_rows(self.target.model),
                          model_vocab_rows(draft_model) if draft_model is not None else None)

    def check_tokens(self, history: list[int], what: str = "prompt"):
        """A one-line MlxspecError for an id no model here can embed (MLX would
        read past the embedding table: a crash, or garbage)."""
        validate_token_ids(history, self.token_limit, what)

    def _chain_round(self, history, k, params, k_draft, k_verify, rnd):
        """Draft a chain of up to k tokens and verify it: (time drafting ended,
        drafted count, accepted tokens, next token, (confidence, kept) outcomes, near-tie
        flags of the emitted rows (greedy; else None))."""
        proposal = self.drafter.propose(history, k, params, k_draft, rnd) if k else EMPTY
        t_verify = time.perf_counter()
        drafted = proposal.tokens
        pending = self.target.sync(history)
        cost = getattr(self.policy, "cost", None)  # a wider pass may cost less (cost_model.pad_width)
        width = cost.pad_width(len(pending) + len(drafted)) if cost is not None and drafted else None
        logits = self.target.forward(pending + drafted, width)[len(pending) - 1:]
        contexts = None
        if params.uses_context:
            contexts = [history + drafted[:i] for i in range(len(drafted) + 1)]
        drafts, ties = mx.array(drafted, dtype=mx.uint32), None
        if params.greedy:  # the argmax of the processed logits: no normalising pass (sampling.greedy_scores)
            scores = greedy_scores(logits, params, contexts)
            accepted, next_tokens = verify(scores, drafts, None, params, None)
            ties = near_ties(logits, scores, next_tokens)
            logprobs = lazy_normalised(scores)
        else:
            logprobs = process_logits(logits, params, contexts)
            if isinstance(k_verify, Coupling):  # coupled sampling: row i is position len(history) + i
                accepted, next_tokens = verify_coupled(logprobs, drafts, k_verify, len(history))
            else:
                accepted, next_tokens = verify(logprobs, drafts, proposal.q, params, k_verify)
        self._round_logprobs = logprobs  # rows 0..n chose the emitted tokens (generate(logprobs=...) reads them)
        finite = mx.isfinite(logits.sum())
        mx.eval(accepted, next_tokens, finite, *([ties] if ties is not None else []))
        if not finite.item():
            raise MlxspecError(
                f"{self.target_name} produced NaN/inf logits: its weights are corrupt or overflow "
                "in this dtype; re-convert or re-download it")
        n = leading_accepted(accepted.tolist())
        outcomes = list(zip(proposal.confidence, [True] * n + [False]))[: n + 1]
        return (t_verify, len(drafted), drafted[:n], next_tokens.tolist()[n], outcomes,
                None if ties is None else ties.tolist()[: n + 1])

    def generate(self, history: list[int], params: SamplingParams = SamplingParams(),
                 max_tokens: int = 256, eos_token_ids=(), stats: GenerationStats | None = None,
                 should_stop: Callable[[], bool] | None = None, logprobs: int | None = None
                 ) -> Iterator[tuple[int, bool]]:
        """Yield (token, from_draft) pairs, appending each token to `history`
        (a list the caller owns) before it is yielded.  EOS is not yielded.  One
        generation at a time per decoder (a second thread's is refused); the decoder is
        free again once this one is exhausted, closed or dropped.  `logprobs` (0-20):
        yield (token, from_draft, (log p(token), [(id, log p), ...] top `logprobs`))
        triples instead, p the target's processed distribution the token was chosen
        from, read off the verify pass (no extra forward).  The penalties and a constraint
        count the generated tokens from len(history) on (`params.completion_start`)."""
        token = self._claim()
        try:
            clear_streams_when_thread_ends()
            if params.uses_context and params.completion_start != len(history):
                params = dataclasses.replace(params, completion_start=len(history))
            yield from self._generate(history, params, max_tokens, eos_token_ids, stats, should_stop, logprobs)
        finally:
            self._release(token)

    def _generate(self, history, params, max_tokens, eos_token_ids, stats, should_stop, want_lp=None):
        stats = stats if stats is not None else GenerationStats()
        stats.drafter = self.drafter.name
        if hasattr(self.policy, "start"):
            self.policy.start(stats, sampled=not params.greedy)  # notes a fallback in stats.notes
        trees = self.trees
        if self.tree_note and (self.tree is True or self.tree_note.kind in NOTED_KINDS):  # asked for, or unexpected
            stats.notes.append(f"verifying chains: {self.tree_note.text}")
        eos = set(eos_token_ids)
        limit = self.context_length
        check_context(history, limit)
        self.check_tokens(history)
        key = None if params.greedy or params.coupled else new_key(params.seed)
        coupling = new_coupling(params.seed) if params.coupled else None  # noise by (seed, position): core/coupled.py

        t0 = time.perf_counter()
        before = self.target.positions
        self.target.prefill(history, should_stop)
        self.drafter.prefill(history, should_stop)
        stats.prompt_tokens = len(history)
        stats.prompt_tokens_processed = self.target.positions - before + 1
        stats.prompt_time = time.perf_counter() - t0
        rounds = stats.rounds  # a list: every round's work is recorded (positions per forward; no clock)
        work = [self.target] + [s for s in (_draft_state(self.drafter),) if s is not None] if rounds is not None else []
        for s in work:
            s.widths = []

        produced, refed = 0, self.target.refed
        t_start = time.perf_counter()
        try:
            while produced < max_tokens:
                if should_stop is not None and should_stop():
                    stats.finish_reason = "cancelled"
                    break
                room = max_tokens - produced - 1
                if limit is not None:
                    room = min(room, limit - len(history) - 1)
                    if room < 0:
                        stats.finish_reason = "context"
                        break
                k = max(0, min(self.policy.choose(), self.drafter.max_k, room))
                if k and getattr(self.policy, "refeed", False):  # what a rejection would re-feed again
                    riding = self.target.pending_count(history) - 1  # the round's own sync rolls back
                    self.policy.observe_refeed(riding if riding <= self.target.merge_limit else 0)
                if key is not None:
                    key, k_draft, k_verify = mx.random.split(key, 3)
                else:  # greedy, or coupled: the drafter and the verify get the Coupling (None when greedy)
                    k_draft = k_verify = coupling
                    if coupling is not None:
                        coupling.forget_before(len(history))

                t_draft = time.perf_counter()
                if k and trees:
                    r = run_tree_round(self.target, self.drafter, self.policy, history, k, params,
                                       k_draft, k_verify, self.target_name, self.lookup)
                    stats.record_tree(r.nodes, r.depth, len(r.accepted), r.siblings_taken, r.lookup_taken)
                    drafted, accepted, nxt, outcomes, rnd = r.nodes, r.accepted, r.next_token, r.outcomes, r.budget
                    t_verify, depth, ties = t_draft + r.draft_time, r.depth, r.ties
                    lp_rows = (r.logprobs, r.rows)
                else:
                    rnd = self.policy.round(k) if k else Round(None, 0)
                    t_verify, drafted, accepted, nxt, outcomes, ties = self._chain_round(history, k, params, k_draft,
                                                                                         k_verify, rnd)
                    depth = None
                    lp_rows = (self._round_logprobs, list(range(len(accepted) + 1)))
                t_end = time.perf_counter()
                n = len(accepted)
                new = accepted + [nxt]
                emit = []
                for tok in new:
                    if tok in eos:
                        stats.finish_reason = "stop"
                        break
                    emit.append(tok)
                    if produced + len(emit) >= max_tokens:
                        break
                stats.draft_time += t_verify - t_draft
                stats.verify_time += t_end - t_verify
                stats.record_round(drafted, n, len(emit), rnd.stop_reason if k else "plain", depth)
                decided = len(emit) + (stats.finish_reason == "stop")  # the EOS was decided here too
                stats.record_near_ties(produced, (ties or [])[:decided])
                if work:  # (draft forwards' widths, the target pass's positions, tokens emitted)
                    rounds.append((tuple(work[1].widths) if len(work) > 1 else (), sum(work[0].widths), len(emit)))
                    for s in work:
                        s.widths.clear()
                self.policy.update(rnd, outcomes, n + 1)
                info = None
                if want_lp is not None and emit:
                    info = token_logprobs(lp_rows[0], lp_rows[1][: len(emit)], emit, want_lp)
                self._round_logprobs = None
                for i, tok in enumerate(emit):
                    history.append(tok)
                    produced += 1
                    yield (tok, i < n) if info is None else (tok, i < n, info[i])
                if stats.finish_reason == "stop":
                    break
            else:
                stats.finish_reason = "length"
        finally:
            stats.generated_tokens = produced
            stats.generation_time = time.perf_counter() - t_start
            if history:
                self.target.sync(history)
            stats.refed_positions = self.target.refed - refed
            for s in work:
                s.widths = None
