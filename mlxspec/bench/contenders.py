"""Benchmark contenders: mlxspec with a drafter and a draft length, or mlx-lm, each timed
the same way by `Contender.run` (from when each token reaches the caller)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import MlxspecError

DRAFTERS = ("model", "hybrid", "lookup", "layerskip")
ALL_CONTENDERS = "plain,mlx-lm,mlx-lm-plain,model,model:auto,model:auto:chain,lookup,lookup:auto,layerskip,layerskip:auto"


@dataclass
class Run:
    """One generation by one contender, timed by the harness."""

    tokens: list
    from_draft: list
    token_times: list  # seconds from the call until each token reached the caller
    total_time: float
    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    proposed_by_position: list = field(default_factory=list)
    accepted_by_position: list = field(default_factory=list)
    peak_memory: int = 0
    finish_reason: str | None = None
    stats: dict | None = None  # mlxspec's GenerationStats, when the contender is mlxspec


def first_round_tokens(from_draft: list) -> int:
    """Tokens produced by the first round: drafts taken, then the target's own token."""
    for i, fd in enumerate(from_draft):
        if not fd:
            return i + 1
    return len(from_draft)


def timing_figures(token_times: list, from_draft: list, total_time: float) -> dict:
    """Decode rate after the first round, the same rule for every contender.

    The first round includes the prompt; excluding all its tokens (not just the
    first) keeps a speculative first burst from counting as free tokens."""
    n = len(token_times)
    m = first_round_tokens(from_draft)
    first = token_times[m - 1] if n else 0.0
    decode_time = token_times[-1] - first if n else 0.0
    decode_tokens = n - m
    if decode_tokens > 0 and decode_time > 0:
        tps = decode_tokens / decode_time
    else:  # everything came in one round: fall back to the end-to-end rate
        tps = n / total_time if total_time > 0 else 0.0
    return {
        "generated_tokens": n,
        "first_round_tokens": m,
        "first_round_time": first,
        "decode_tokens": decode_tokens,
        "decode_time": decode_time,
        "decode_tps": tps,
        "total_time": total_time,
        "e2e_tps": n / total_time if total_time > 0 else 0.0,
    }


def mlxlm_parse(from_draft: list, k: int, max_tokens: int) -> list[tuple[int, int, int]]:
    """(drafted, accepted, own) per round, rebuilt from mlx-lm's from_draft flags: own is 1
    when the round ended with the target's own token.

    mlx-lm's `speculative_generate_step` drafts min(k, max_tokens - produced)
    tokens per round, yields the accepted drafts (from_draft=True) and then the
    target's own token (False), except when max_tokens is reached first.  A
    round cut short by EOS counts the drafts seen before it."""
    rounds, i, produced, n = [], 0, 0, len(from_draft)
    while i < n:
        nd = min(k, max_tokens - produced)
        acc = 0
        while i < n and from_draft[i] and acc < nd:
            acc += 1
            i += 1
        own = 1 if i < n and not from_draft[i] else 0
        i += own
        produced += acc + own
        rounds.append((nd, acc, own))
    return rounds


def mlxlm_rounds(from_draft: list, k: int, max_tokens: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per round (mlxlm_parse)."""
    return [(nd, acc) for nd, acc, _ in mlxlm_parse(from_draft, k, max_tokens)]


def position_counts(rounds: list[tuple[int, int]]) -> tuple[list, list]:
    width = max((d for d, _ in rounds), default=0)
    proposed, accepted = [0] * width, [0] * width
    for d, a in rounds:
        for i in range(d):
            proposed[i] += 1
            if i < a:
                accepted[i] += 1
    return proposed, accepted


class Contender:
    """Something that generates from token ids.  Subclasses implement `stream`
    (yield (token, from_draft), EOS excluded, filling `info` with counts);
    `run` times it the same way for everyone."""

    kind = "base"
    drafter: str | None = None
    num_draft = None

    def __init__(self, name: str, spec: str = ""):
        self.name = name
        self.spec = spec or name

    def unavailable(self, pair) -> str | None:
        """Why this contender cannot run on `pair` here, or None."""
        return None

    def stream(self, pair, ids: list[int], temp: float, max_tokens: int, seed: int, info: dict) -> Iterator:
        raise NotImplementedError

    def run(self, pair, ids: list[int], *, temp: float, max_tokens: int, seed: int) -> Run:
        import mlx.core as mx

        mx.clear_cache()
        mx.reset_peak_memory()
        info: dict = {}
        tokens, flags, times = [], [], []
        t0 = time.perf_counter()
        for tok, fd in self.stream(pair, list(ids), temp, max_tokens, seed, info):
            times.append(time.perf_counter() - t0)
            tokens.append(int(tok))
            flags.append(bool(fd))
        total = time.perf_counter() - t0
        run = Run(tokens, flags, times, total, peak_memory=int(mx.get_peak_memory()))
        self.count(run, info, max_tokens)
        return run

    def count(self, run: Run, info: dict, max_tokens: int) -> None:
        stats = info.get("stats")
        if stats is None:
            run.target_passes = len(run.tokens)
            return
        run.proposed, run.accepted = stats.draft_proposed, stats.draft_accepted
        run.target_passes = stats.target_passes
        run.proposed_by_position = list(stats.proposed_by_position)
        run.accepted_by_position = list(stats.accepted_by_position)
        run.finish_reason = stats.finish_reason
        run.stats = stats.to_dict()

    def describe(self) -> dict:
        return {"name": self.name, "spec": self.spec, "kind": self.kind, "drafter": self.drafter,
                "num_draft": self.num_draft}


class MlxspecContender(Contender):
    """mlxspec's decoder with a drafter and a draft-length policy; a fresh decoder per
    generation, so every run starts from empty caches and an untrained policy."""

    kind = "mlxspec"

    def __init__(self, name: str, drafter: str = "model", num_draft=3, spec: str = "", p_min: float = 0.0,
                 tree: bool | None = None):
        super().__init__(name, spec)
        self.tree = tree  # None: trees where supported (the default); False: chains
        self.drafter = drafter
        self.num_draft = num_draft if drafter != "none" else 0
        self.p_min = p_min
        self.cost_profile = None  # `bench --profile`: decide by that profile's costs (costs/profiles.py)
        self.cost_used = None  # the cost model its last decoder decided by (None: a fixed k)

    def unavailable(self, pair):
        if self.drafter == "none":
            return None
        if self.drafter in ("model", "hybrid") and pair.draft is None:
            return "no draft model loaded"
        if self.drafter not in ("model", "hybrid"):
            from ..drafting import drafters

            if self.drafter not in drafters.DRAFTERS:
                return f"this mlxspec has no {self.drafter!r} drafter (not in mlxspec.drafting.drafters.DRAFTERS)"
        try:
            self.decoder(pair)
        except (MlxspecError, NotImplementedError, TypeError, ValueError, AttributeError) as e:
            return f"cannot build it: {e}"
        return None

    def decoder(self, pair):
        from ..api import make_decoder

        decoder = make_decoder(pair, self.drafter, self.num_draft, self.p_min, tree=self.tree,
                               cost_profile=self.cost_profile)
        self.cost_used = getattr(decoder.policy, "cost", None)
        return decoder

    def stream(self, pair, ids, temp, max_tokens, seed, info):
        # the public streaming API, which detokenizes as it goes (as mlx-lm's does)
        from ..api import stream_generate

        stream = stream_generate(pair, ids, max_tokens=max_tokens, decoder=self.decoder(pair), temp=temp, seed=seed,
                                 sampling=getattr(self, "sampling", None))  # bench --sampling (core/coupled.py)
        info["stats"] = stream.stats
        stream.stats.rounds = []  # each round's work, for `bench --profile` (bench/projection.py)
        for chunk in stream:
            if chunk.token >= 0:  # -1: the detokenizer's trailing text, no token
                yield chunk.token, chunk.from_draft


class MlxLmContender(Contender):
    """mlx-lm's own `stream_generate`, with a draft model (k drafts per round) or without."""

    kind = "mlx-lm"

    def __init__(self, name: str, num_draft: int | None = 3, spec: str = ""):
        super().__init__(name, spec)
        self.num_draft = num_draft
        self.drafter = "model" if num_draft else None

    def unavailable(self, pair):
        if self.num_draft and pair.draft is None:
            return "no draft model loaded"
        return None

    def stream(self, pair, ids, temp, max_tokens, seed, info):
        import mlx.core as mx
        from mlx_lm.generate import stream_generate
        from mlx_lm.sample_utils import make_sampler

        mx.random.seed(seed)
        kw = {"sampler": make_sampler(temp)}
        if self.num_draft:
            kw.update(draft_model=pair.draft, num_draft_tokens=self.num_draft)
        for r in stream_generate(pair.target, pair.tokenizer, mx.array(ids, dtype=mx.uint32), max_tokens, **kw):
            info["finish_reason"] = r.finish_reason
            if r.finish_reason == "stop":  # the final response carries the EOS token
                break
            yield r.token, r.from_draft

    def count(self, run, info, max_tokens):
        run.finish_reason = info.get("finish_reason")
        if not self.num_draft:
            run.target_passes = len(run.tokens)
            return
        rounds = mlxlm_rounds(run.from_draft, self.num_draft, max_tokens)
        run.target_passes = len(rounds)
        run.proposed = sum(d for d, _ in rounds)
        run.accepted = sum(a for _, a in rounds)
        run.proposed_by_position, run.accepted_by_position = position_counts(rounds)


def parse_k(value: str, default):
    if value in ("", None):
        return default
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        raise MlxspecError(f"bad draft length {value!r}: a whole number or 'auto'")
    if not 1 <= k <= 16:
        raise MlxspecError(f"draft length must be between 1 and 16, got {k}")
    return k


def make_contender(spec: str, default_k: int = 3) -> Contender:
    """'plain', 'mlx-lm[:K]', 'mlx-lm-plain', or '<drafter>[:K|:auto][:chain]' for drafter in
    model/lookup/layerskip (':chain': verify chains, not trees)."""
    spec = spec.strip()
    name, _, arg = spec.partition(":")
    arg, _, shape = arg.partition(":")
    if shape not in ("", "chain"):
        raise MlxspecError(f"bad contender {spec!r}: the third part can only be 'chain'")
    if name == "plain":
        return MlxspecContender("plain", "none", 0, spec)
    if name == "mlx-lm-plain":
        return MlxLmContender("mlx-lm plain", None, spec)
    if name == "mlx-lm":
        k = parse_k(arg, default_k)
        if k == "auto":
            raise MlxspecError("mlx-lm has no adaptive draft length: use mlx-lm or mlx-lm:K")
        return MlxLmContender(f"mlx-lm k={k}", k, spec)
    if name in DRAFTERS:
        k = parse_k(arg, default_k)
        label = f"mlxspec {name} " + ("auto" if k == "auto" else f"k={k}") + (" chains" if shape else "")
        return MlxspecContender(label, name, k, spec, tree=False if shape else None)
    raise MlxspecError(
        f"unknown contender {spec!r}: plain, mlx-lm[:K], mlx-lm-plain, or {'/'.join(DRAFTERS)}[:K|:auto]")


def default_contenders() -> str:
    """plain, mlx-lm, the draft model at fixed k and with the per-token draft length
    (the default: trees where supported; and with chains only), and prompt lookup."""
    return "plain,mlx-lm,model,model:auto,model:auto:chain,lookup:auto"


def make_contenders(specs: str | None, default_k: int = 3) -> list[Contender]:
    """Contenders from a comma-separated spec list ('all', or None for the default line-up)."""
    if specs is None or specs.strip() == "default":
        specs = default_contenders()
    elif specs.strip() == "all":
        specs = ALL_CONTENDERS
    out, names = [], set()
    for s in specs.split(","):
        if not s.strip():
            continue
        c = make_contender(s, default_k)
        if c.name not in names:
            out.append(c)
            names.add(c.name)
    if "plain" not in names:  # the baseline for speed-ups and the greedy check
        out.insert(0, make_contender("plain"))
    return out
