"""`mlxspec bench`: speculative decoding measured against plain decoding and mlx-lm.

    mlxspec bench                                  # default pair, all suites, greedy
    mlxspec bench --suite code,grounded --temps 0,0.7 --repeats 3 --out results/
    mlxspec bench --quick                          # "will it pay?" before committing to a pair

One process, one loaded pair.  Contenders run interleaved prompt by prompt (and
in a rotated order), so drift of a shared machine hits all of them alike:

* `plain`        mlxspec with no drafter: the same loop with k = 0 (the baseline);
* `mlx-lm`       mlx-lm's own `stream_generate(..., draft_model=, num_draft_tokens=k)`
                 on the same models, with `make_sampler(temp)`;
* `model`, `lookup`, `layerskip` [`:K` | `:auto`]: mlxspec with that drafter and a
                 fixed k or the adaptive policy, where the installed mlxspec has them;
* `mlx-lm-plain` mlx-lm without a draft (its loop overhead against ours), opt-in.

Every contender gets the same chat-templated token ids, the same max tokens and
(at T > 0) the same seed; one short warm-up generation per contender is run and
discarded.  Timing is taken uniformly by this harness, from when each token
reaches the caller: decode tok/s excludes the prompt *and the first round* (for
all contenders alike: up to the first token not taken from a draft), so
prefill is not mixed into the decode rate and no contender gets its first
burst of tokens free.  Speed-ups are ratios per prompt (each contender's median
over repeats over plain's), then the median over prompts.

Outputs: a table on the terminal, and in --out: results.json (every raw
figure, the machine and backend), summary.md and chart.png (matplotlib, the
optional `bench` extra).

Prompt suites are JSON files (benchmarks/suites/*.json in a checkout, or
mlxspec/bench_suites/ when packaged; $MLXSPEC_BENCH_SUITES overrides); --suite
also takes a path to a suite file.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import click

from .errors import MlxspecError
from .generate_cli import model_options

SCHEMA = "mlxspec-bench/1"
DEFAULT_SUITES = ("code", "chat", "grounded", "creative")
DRAFTERS = ("model", "hybrid", "lookup", "layerskip")
ALL_CONTENDERS = "plain,mlx-lm,mlx-lm-plain,model,model:auto,lookup,lookup:auto,layerskip,layerskip:auto"
DEFAULT_MAX_TOKENS = 40
QUICK_MAX_TOKENS = 16
WARMUP_TOKENS = 8
NEAR_TIE = 0.05  # logit gap below which a greedy divergence is put down to float rounding


# --------------------------------------------------------------------------------------------
# Prompt suites


@dataclass
class Prompt:
    suite: str
    id: str
    messages: list

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.id}"


@dataclass
class Suite:
    name: str
    description: str
    prompts: list
    path: str = ""


def suite_dirs() -> list[Path]:
    """Where suites are looked for, in order."""
    here = Path(__file__).resolve().parent
    dirs = []
    env = os.environ.get("MLXSPEC_BENCH_SUITES")
    if env:
        dirs.append(Path(env).expanduser())
    dirs += [here.parent / "benchmarks" / "suites", here / "bench_suites", Path.cwd() / "benchmarks" / "suites"]
    return dirs


def find_suite_file(name: str) -> Path:
    p = Path(name).expanduser()
    if p.suffix == ".json" or p.is_file():
        if not p.is_file():
            raise MlxspecError(f"suite file not found: {p}")
        return p
    for d in suite_dirs():
        f = d / f"{name}.json"
        if f.is_file():
            return f
    available = sorted({f.stem for d in suite_dirs() if d.is_dir() for f in d.glob("*.json")})
    if not available:
        raise MlxspecError("no benchmark suites found (looked in " + ", ".join(map(str, suite_dirs()))
                           + "); pass --suite path/to/suite.json")
    raise MlxspecError(f"unknown suite {name!r}; available: {', '.join(available)} (or a path to a .json file)")


def parse_suite(data: dict, path: str = "") -> Suite:
    """Validate a suite document: {"name", "description", "prompts": [{"id", "prompt" | "messages"}]}."""
    where = path or "suite"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise MlxspecError(f"{where}: a suite needs a non-empty 'name'")
    prompts = data.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise MlxspecError(f"{where}: a suite needs a non-empty 'prompts' list")
    out, seen = [], set()
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or not isinstance(p.get("id"), str) or not p["id"]:
            raise MlxspecError(f"{where}: prompt {i} needs an 'id'")
        if p["id"] in seen:
            raise MlxspecError(f"{where}: duplicate prompt id {p['id']!r}")
        seen.add(p["id"])
        if isinstance(p.get("messages"), list) and p["messages"]:
            messages = p["messages"]
            if not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages):
                raise MlxspecError(f"{where}: prompt {p['id']!r}: messages need 'role' and 'content'")
        elif isinstance(p.get("prompt"), str) and p["prompt"].strip():
            messages = ([{"role": "system", "content": p["system"]}] if p.get("system") else []) + [
                {"role": "user", "content": p["prompt"]}]
        else:
            raise MlxspecError(f"{where}: prompt {p['id']!r} needs 'prompt' text or 'messages'")
        out.append(Prompt(data["name"], p["id"], messages))
    return Suite(data["name"], data.get("description", ""), out, path)


def load_suite(name: str) -> Suite:
    f = find_suite_file(name)
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise MlxspecError(f"cannot read suite {f}: {e}") from e
    return parse_suite(data, str(f))


def select_prompts(suites: list[Suite], per_suite: int) -> list[Prompt]:
    """The first `per_suite` prompts of each suite (0 = all), suite by suite."""
    out = []
    for s in suites:
        out += s.prompts if per_suite <= 0 else s.prompts[:per_suite]
    return out


def encode(tokenizer, prompt: Prompt) -> list[int]:
    """Chat template when the tokenizer has one (same ids for every contender), else the user text."""
    from .api import encode_prompt

    if getattr(tokenizer, "chat_template", None):
        return encode_prompt(tokenizer, prompt.messages)
    return encode_prompt(tokenizer, "\n\n".join(m["content"] for m in prompt.messages))


# --------------------------------------------------------------------------------------------
# Contenders


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


def mlxlm_rounds(from_draft: list, k: int, max_tokens: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per round, rebuilt from mlx-lm's from_draft flags.

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
        produced += acc
        if i < n and not from_draft[i]:
            i += 1
            produced += 1
        rounds.append((nd, acc))
    return rounds


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

    def __init__(self, name: str, drafter: str = "model", num_draft=3, spec: str = "", p_min: float = 0.0):
        super().__init__(name, spec)
        self.drafter = drafter
        self.num_draft = num_draft if drafter != "none" else 0
        self.p_min = p_min

    def unavailable(self, pair):
        if self.drafter == "none":
            return None
        if self.drafter in ("model", "hybrid") and pair.draft is None:
            return "no draft model loaded"
        if self.drafter not in ("model", "hybrid"):
            from . import drafters

            if self.drafter not in drafters.DRAFTERS:
                return f"this mlxspec has no {self.drafter!r} drafter (not in mlxspec.drafters.DRAFTERS)"
        try:
            self.decoder(pair)
        except (MlxspecError, NotImplementedError, TypeError, ValueError, AttributeError) as e:
            return f"cannot build it: {e}"
        return None

    def decoder(self, pair):
        from .api import make_decoder

        return make_decoder(pair, self.drafter, self.num_draft, self.p_min)

    def stream(self, pair, ids, temp, max_tokens, seed, info):
        # the public streaming API, which detokenizes as it goes (as mlx-lm's does)
        from .api import stream_generate

        stream = stream_generate(pair, ids, max_tokens=max_tokens, decoder=self.decoder(pair), temp=temp, seed=seed)
        info["stats"] = stream.stats
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
    """'plain', 'mlx-lm[:K]', 'mlx-lm-plain', or '<drafter>[:K|:auto]' for drafter in model/lookup/layerskip."""
    spec = spec.strip()
    name, _, arg = spec.partition(":")
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
        return MlxspecContender(f"mlxspec {name} " + ("auto" if k == "auto" else f"k={k}"), name, k, spec)
    raise MlxspecError(
        f"unknown contender {spec!r}: plain, mlx-lm[:K], mlx-lm-plain, or {'/'.join(DRAFTERS)}[:K|:auto]")


def default_contenders() -> str:
    """plain, mlx-lm, the draft model at fixed k and with the per-token draft length
    (the default), and prompt lookup."""
    return "plain,mlx-lm,model,model:auto,lookup:auto"


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


# --------------------------------------------------------------------------------------------
# Figures (pure functions)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pairwise_speedup(contender_tps: dict, baseline_tps: dict) -> tuple[float | None, dict]:
    """{prompt: [tok/s per repeat]} for a contender and the baseline -> (median over
    prompts of the per-prompt ratio of medians, {prompt: ratio}).  Prompts the
    baseline lacks (or with zero speed) are left out."""
    ratios = {}
    for key, xs in contender_tps.items():
        base = median(baseline_tps.get(key, []))
        mine = median(xs)
        if base and mine is not None:
            ratios[key] = mine / base
    return median(ratios.values()), ratios


def first_divergence(a: list, b: list) -> int | None:
    """Index of the first difference between two token lists, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_greedy(records: list[dict], baseline: str = "plain") -> None:
    """Mark every temp-0 record with whether its tokens equal the baseline's for the
    same prompt and repeat (matches_plain, first_divergence)."""
    base = {(r["prompt"], r["repeat"]): r["tokens"] for r in records
            if r["contender"] == baseline and r["temp"] == 0}
    for r in records:
        if r["temp"] != 0:
            r["matches_plain"] = None
            continue
        ref = base.get((r["prompt"], r["repeat"]))
        if ref is None:
            r["matches_plain"] = None
            continue
        d = first_divergence(r["tokens"], ref)
        r["matches_plain"] = d is None
        r["first_divergence"] = d


def summarize(records: list[dict], contenders: list[str], baseline: str = "plain") -> list[dict]:
    """One row per (temp, suite, contender), plus suite 'all'."""
    rows = []
    temps = sorted({r["temp"] for r in records})
    suites = list(dict.fromkeys(r["suite"] for r in records))
    for temp in temps:
        for suite in suites + (["all"] if len(suites) > 1 else []):
            sel = [r for r in records if r["temp"] == temp and (suite == "all" or r["suite"] == suite)]
            if not sel:
                continue
            tps_by, e2e_by = {}, {}
            for r in sel:
                tps_by.setdefault(r["contender"], {}).setdefault(r["prompt"], []).append(r["decode_tps"])
                e2e_by.setdefault(r["contender"], {}).setdefault(r["prompt"], []).append(r["e2e_tps"])
            base_tps = tps_by.get(baseline, {})
            for c in contenders:
                mine = [r for r in sel if r["contender"] == c]
                if not mine:
                    continue
                per_prompt_tps = {k: median(v) for k, v in tps_by[c].items()}
                speedup, ratios = pairwise_speedup(tps_by[c], base_tps)
                proposed = sum(r["proposed"] for r in mine)
                accepted = sum(r["accepted"] for r in mine)
                passes = sum(r["target_passes"] for r in mine)
                tokens = sum(r["generated_tokens"] for r in mine)
                checked = [r["matches_plain"] for r in mine if r.get("matches_plain") is not None]
                rows.append({
                    "temp": temp,
                    "suite": suite,
                    "contender": c,
                    "prompts": len(per_prompt_tps),
                    "runs": len(mine),
                    "tokens_per_s": median(per_prompt_tps.values()),
                    "e2e_tokens_per_s": median(r["e2e_tps"] for r in mine),
                    "speedup": speedup,
                    "speedup_per_prompt": ratios,
                    "e2e_speedup": pairwise_speedup(e2e_by[c], e2e_by.get(baseline, {}))[0],  # prompt time included
                    "acceptance_rate": accepted / proposed if proposed else None,
                    "draft_proposed": proposed,
                    "draft_accepted": accepted,
                    "mean_accepted_length": tokens / passes if passes else None,
                    "draft_token_share": sum(sum(r["from_draft"]) for r in mine) / tokens if tokens else 0.0,
                    "generated_tokens": tokens,
                    "peak_memory_bytes": max(r["peak_memory_bytes"] for r in mine),
                    "greedy_match": {"matched": sum(checked), "checked": len(checked)} if checked else None,
                })
    return rows


# --------------------------------------------------------------------------------------------
# The runner


def _fmt_time(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def record_of(run: Run, contender: Contender, prompt: Prompt, prompt_tokens: int, temp: float, repeat: int,
              seed: int) -> dict:
    rec = {
        "contender": contender.name,
        "suite": prompt.suite,
        "prompt": prompt.key,
        "prompt_tokens": prompt_tokens,
        "temp": temp,
        "repeat": repeat,
        "seed": seed,
        **timing_figures(run.token_times, run.from_draft, run.total_time),
        "proposed": run.proposed,
        "accepted": run.accepted,
        "acceptance_rate": run.accepted / run.proposed if run.proposed else None,
        "target_passes": run.target_passes,
        "mean_accepted_length": len(run.tokens) / run.target_passes if run.target_passes else None,
        "proposed_by_position": run.proposed_by_position,
        "accepted_by_position": run.accepted_by_position,
        "peak_memory_bytes": run.peak_memory,
        "finish_reason": run.finish_reason,
        "tokens": run.tokens,
        "from_draft": run.from_draft,
        "token_times": [round(t, 5) for t in run.token_times],
        "matches_plain": None,
        "first_divergence": None,
    }
    if run.stats is not None:
        rec["mlxspec_stats"] = {k: v for k, v in run.stats.items() if k not in ("k_history",)}
        rec["k_history"] = run.stats.get("k_history")
    return rec


def logit_gap(model, ids: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| for the next token after `ids`, from a fresh cache:
    how close the target's choice between two greedy continuations was."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(ids, dtype=mx.uint32)[None], cache=cache)[0, -1]
    return abs(float(logits[a].item()) - float(logits[b].item()))


def explain_divergences(pair, records: list[dict], ids_by_prompt: dict) -> None:
    """For greedy mismatches, the target's logit gap between the two tokens at the
    first difference: a near-tie (float rounding of a different batch shape)
    versus a real error."""
    base = {(r["prompt"], r["repeat"]): r["tokens"] for r in records if r["contender"] == "plain" and r["temp"] == 0}
    for r in records:
        if r.get("matches_plain") is not False:
            continue
        i = r["first_divergence"]
        ref = base[(r["prompt"], r["repeat"])]
        if i is None or i >= len(ref) or i >= len(r["tokens"]):
            r["near_tie_gap"] = None
            continue
        gap = logit_gap(pair.target, ids_by_prompt[r["prompt"]] + ref[:i], ref[i], r["tokens"][i])
        r["near_tie_gap"] = gap
        r["near_tie"] = gap < NEAR_TIE


def run_benchmark(pair, prompts: list[Prompt], contenders: list[Contender], *, temps=(0.0,), repeats: int = 1,
                  max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, warmup: bool = True,
                  echo: Callable[[str], None] = print) -> dict:
    """Run every contender on every prompt (interleaved), return records + summary."""
    t_start = time.perf_counter()
    skipped, active = [], []
    for c in contenders:
        why = c.unavailable(pair)
        if why:
            skipped.append({"contender": c.name, "spec": c.spec, "reason": why})
            echo(f"skipping {c.name}: {why}")
        else:
            active.append(c)
    if not any(c.name == "plain" for c in active):
        raise MlxspecError("the benchmark needs the 'plain' contender as its baseline")
    ids_by_prompt = {p.key: encode(pair.tokenizer, p) for p in prompts}

    warm = {}
    if warmup:
        from .api import encode_prompt

        wids = encode_prompt(pair.tokenizer, "Say hello.", chat_template=True)
        for temp in reversed(temps):  # every temperature: mlx-lm compiles its samplers on first use
            for c in active:
                run = c.run(pair, wids, temp=temp, max_tokens=WARMUP_TOKENS, seed=seed)
                warm[c.name] = {"prompt_tokens": len(wids), "temp": temp,
                                **timing_figures(run.token_times, run.from_draft, run.total_time)}
        est = estimate_seconds(warm, active, [len(v) for v in ids_by_prompt.values()], len(temps) * repeats,
                               max_tokens)
        echo(f"warm-up done in {_fmt_time(time.perf_counter() - t_start)}; "
             f"{len(active)} contenders x {len(prompts)} prompts x {len(temps)} temps x {repeats} repeats; "
             f"rough estimate {_fmt_time(est)} (m:ss)")

    records, total = [], len(active) * len(prompts) * len(temps) * repeats
    done, interrupted = 0, False
    try:
        for temp in temps:
            for pi, prompt in enumerate(prompts):
                ids = ids_by_prompt[prompt.key]
                for rep in range(repeats):
                    shift = (pi + rep) % len(active)
                    order = active[shift:] + active[:shift]  # rotate, so no contender always goes first
                    run_seed = seed + rep
                    for c in order:
                        run = c.run(pair, ids, temp=temp, max_tokens=max_tokens, seed=run_seed)
                        rec = record_of(run, c, prompt, len(ids), temp, rep, run_seed)
                        records.append(rec)
                        done += 1
                        acc = (f", acceptance {100 * rec['acceptance_rate']:.0f}%"
                               if rec["acceptance_rate"] is not None else "")
                        echo(f"[{done}/{total} {_fmt_time(time.perf_counter() - t_start)}] {prompt.key} T={temp:g} "
                             f"#{rep}  {c.name}: {rec['generated_tokens']} tok, {rec['decode_tps']:.2f} tok/s{acc}")
    except KeyboardInterrupt:
        if not records:
            raise
        interrupted = True
        echo(f"interrupted after {done}/{total} runs: reporting those")
    check_greedy(records)
    explain_divergences(pair, records, ids_by_prompt)
    names = [c.name for c in active]
    return {
        "contenders": [c.describe() for c in active],
        "skipped": skipped,
        "prompts": [{"key": p.key, "suite": p.suite, "id": p.id, "prompt_tokens": len(ids_by_prompt[p.key])}
                    for p in prompts],
        "warmup": warm,
        "runs": records,
        "summary": summarize(records, names),
        "interrupted": interrupted,
        "elapsed_s": time.perf_counter() - t_start,
    }


def estimate_seconds(warm: dict, contenders: list[Contender], prompt_lengths: list[int], passes: int,
                     max_tokens: int) -> float:
    """Rough run time from the warm-up: decode at the warm-up rate, prompt time scaled by length."""
    total = 0.0
    for c in contenders:
        w = warm.get(c.name)
        if not w or not w["decode_tps"]:
            continue
        per_tok_prompt = w["first_round_time"] / max(w["prompt_tokens"], 1)
        for n in prompt_lengths:
            total += passes * (max_tokens / w["decode_tps"] + per_tok_prompt * n)
    return total


# --------------------------------------------------------------------------------------------
# Reports


def machine_info() -> dict:
    import mlx.core as mx

    from .backend import describe

    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "backend": describe(),
        "device": str(mx.default_device()),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_bytes": mem,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "load_average": load,
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("mlx", "mlx-lm", "mlxspec", "numpy", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def _match(m):
    return "-" if not m else f"{m['matched']}/{m['checked']}"


TABLE_COLUMNS = ("suite", "contender", "tok/s", "speed-up", "e2e", "accept", "tok/pass", "peak MB", "= plain")


def table_rows(summary: list[dict], temp: float) -> list[list[str]]:
    rows = []
    for r in summary:
        if r["temp"] != temp:
            continue
        rows.append([
            r["suite"], r["contender"], _num(r["tokens_per_s"]),
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
            "-" if r.get("e2e_speedup") is None else f"{r['e2e_speedup']:.2f}x", _pct(r["acceptance_rate"]),
            _num(r["mean_accepted_length"]), f"{r['peak_memory_bytes'] / 2**20:.0f}", _match(r["greedy_match"]),
        ])
    return rows


def format_table(summary: list[dict]) -> str:
    out = []
    for temp in sorted({r["temp"] for r in summary}):
        rows = table_rows(summary, temp)
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(TABLE_COLUMNS)]
        out.append(f"temperature {temp:g}" + ("  (greedy: '= plain' counts outputs identical to plain decoding)"
                                              if temp == 0 else ""))
        line = "  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(TABLE_COLUMNS, widths)))
        out += [line, "-" * len(line)]
        prev = None
        for row in rows:
            if prev is not None and row[0] != prev:
                out.append("")
            prev = row[0]
            out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        out.append("")
    return "\n".join(out)


def markdown(doc: dict) -> str:
    m, cfg = doc["machine"], doc["config"]
    lines = [
        "# mlxspec bench",
        "",
        f"- command: `{doc['command']}`",
        f"- date: {doc['date']}",
        f"- pair: {doc['pair']['describe']}",
        f"- backend: {m['backend']}; {m['platform']}; {m['cpu_count']} CPUs; load average at start "
        f"{', '.join(f'{x:.2f}' for x in (doc.get('load_average_start') or []))}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v),
        f"- prompts: {len(doc['prompts'])} ({', '.join(cfg['suites'])}; {cfg['prompts_per_suite'] or 'all'} per suite), "
        f"max {cfg['max_tokens']} tokens, temperatures {', '.join(f'{t:g}' for t in cfg['temps'])}, "
        f"{cfg['repeats']} repeat(s), seed {cfg['seed']}; run time {_fmt_time(doc['elapsed_s'])}"
        + (" (INTERRUPTED: partial results)" if doc.get("interrupted") else ""),
        "",
        "tok/s: decode rate after the first round (median over prompts); speed-up: per-prompt ratio to plain, "
        "median over prompts; e2e: the same with prompt processing included; accept: drafted tokens kept; tok/pass: tokens per target forward pass; "
        "= plain: greedy outputs identical to plain decoding (token ids).",
        "",
    ]
    for temp in sorted({r["temp"] for r in doc["summary"]}):
        lines += [f"## Temperature {temp:g}", "", "| " + " | ".join(TABLE_COLUMNS) + " |",
                  "|" + "|".join(["---"] * 2 + ["---:"] * (len(TABLE_COLUMNS) - 2)) + "|"]
        for row in table_rows(doc["summary"], temp):
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    mism = [r for r in doc["runs"] if r.get("matches_plain") is False]
    if mism:
        lines += ["## Greedy outputs that differ from plain decoding", ""]
        for r in mism:
            gap = r.get("near_tie_gap")
            why = "" if gap is None else (f"; target logit gap {gap:.3g}: "
                                          + ("a near-tie (float rounding)" if r.get("near_tie") else "NOT a near-tie"))
            lines.append(f"- {r['contender']} on {r['prompt']} (repeat {r['repeat']}): first difference at token "
                         f"{r['first_divergence']}{why}")
        lines.append("")
    if doc["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s['contender']}: {s['reason']}" for s in doc["skipped"]] + [""]
    if doc.get("chart"):
        lines += [f"![speed-up and acceptance]({Path(doc['chart']).name})", ""]
    return "\n".join(lines)


def chart(doc: dict, path: Path) -> str | None:
    """speed-up and acceptance per suite and contender; None (and a reason) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    summary = doc["summary"]
    temps = sorted({r["temp"] for r in summary})
    suites = list(dict.fromkeys(r["suite"] for r in summary))
    names = [c["name"] for c in doc["contenders"] if c["name"] != "plain"]
    if not names:
        return None
    fig, axes = plt.subplots(len(temps), 2, figsize=(13, 4.2 * len(temps)), squeeze=False)
    width = 0.8 / len(names)
    for ti, temp in enumerate(temps):
        by = {(r["suite"], r["contender"]): r for r in summary if r["temp"] == temp}
        for ai, (metric, label) in enumerate((("speedup", "speed-up vs plain (x)"),
                                              ("acceptance_rate", "acceptance rate"))):
            ax = axes[ti][ai]
            for ci, name in enumerate(names):
                vals = [(by.get((s, name)) or {}).get(metric) or 0.0 for s in suites]
                xs = [i + (ci - (len(names) - 1) / 2) * width for i in range(len(suites))]
                bars = ax.bar(xs, vals, width, label=name)
                for b, v in zip(bars, vals):
                    if v:
                        ax.annotate(f"{v:.2f}" if metric == "speedup" else f"{100 * v:.0f}%",
                                    (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
            if metric == "speedup":
                ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            else:
                ax.set_ylim(0, 1.05)
            ax.set_xticks(range(len(suites)))
            ax.set_xticklabels(suites)
            ax.set_ylabel(label)
            ax.set_title(f"{label}, T={temp:g}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(names), 4), fontsize=8, frameon=False)
    fig.suptitle(f"mlxspec bench: {doc['pair']['describe']}\n{doc['machine']['backend']}", fontsize=10)
    rows = (len(names) + 3) // 4
    fig.tight_layout(rect=(0, 0.03 + 0.035 * rows / len(temps), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_outputs(doc: dict, out: Path, echo=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(out / "results.json"), "markdown": str(out / "summary.md")}
    png = chart(doc, out / "chart.png")
    if png:
        paths["png"] = png
        doc["chart"] = png
    else:
        echo("no chart: matplotlib is not installed (pip install 'mlxspec[bench]')")
    doc["outputs"] = paths
    Path(paths["json"]).write_text(json.dumps(doc, indent=1))
    Path(paths["markdown"]).write_text(markdown(doc))
    return paths


# --------------------------------------------------------------------------------------------
# --quick: will it pay?


def expected_tokens(acc_by_position: list[float], k: int) -> float:
    """Tokens per round with k drafts from per-position acceptance A_i = P(drafts 0..i all kept)."""
    return 1.0 + sum(acc_by_position[:k])


def expected_tokens_geometric(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): Leviathan et al. with per-token acceptance a."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def per_token_acceptance(proposed: list[int], accepted: list[int]) -> float:
    """Fit of a per-token acceptance a: drafts kept over drafts judged (a draft is judged
    only when every earlier draft of its round was kept)."""
    judged = 0
    for i, p in enumerate(proposed):
        judged += p if i == 0 else min(p, accepted[i - 1])
    return sum(accepted) / judged if judged else 0.0


def predict(acc_by_position: list[float], a: float, c: float, verify_ratio: dict) -> list[dict]:
    """Predicted speed-up per k: E[tokens per round] / (k*c + verify(k)/verify(0))."""
    rows = []
    for k in sorted(verify_ratio):
        if k == 0 or k > len(acc_by_position):
            continue
        cost = k * c + verify_ratio[k]
        e_pos, e_geo = expected_tokens(acc_by_position, k), expected_tokens_geometric(a, k)
        rows.append({"k": k, "expected_tokens": e_pos, "expected_tokens_geometric": e_geo, "cost": cost,
                     "speedup": e_pos / cost, "speedup_geometric": e_geo / cost})
    return rows


def recommend(rows: list[dict], margin: float = 1.05) -> dict:
    if not rows:
        return {"k": 0, "speedup": None, "pays": False}
    best = max(rows, key=lambda r: r["speedup"])
    return {"k": best["k"] if best["speedup"] >= margin else 0, "best_k": best["k"], "speedup": best["speedup"],
            "pays": best["speedup"] >= margin}


def time_forward(models: dict, ids: list[int], jobs: list[tuple[str, int]], min_reps: int = 3,
                 budget_s: float = 0.3, max_reps: int = 50) -> dict:
    """Seconds (the minimum over repeats: interference only adds) of one forward of models[name] over T positions (+ log-softmax and
    argmax, as in a decoding step) after a cached context `ids`, for each (name, T)
    job.  Jobs are interleaved, so drift of a shared machine hits all alike; at
    least `min_reps` passes, more while a pass is cheap (small models), after one
    warm-up pass."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    caches = {}
    for name, model in models.items():
        caches[name] = make_prompt_cache(model)
        if len(ids) > 1:
            model(mx.array(ids[:-1], dtype=mx.uint32)[None], cache=caches[name])
            mx.eval([c.state for c in caches[name]])
    longest = max(T for _, T in jobs)
    pool = (ids * (longest // max(len(ids), 1) + 1))[-longest:]
    times = {job: [] for job in jobs}
    spent, rep = 0.0, 0
    while rep <= min_reps or (spent < budget_s * len(jobs) and rep <= max_reps):
        for name, T in jobs:
            x = mx.array(pool[:T], dtype=mx.uint32)[None]
            t0 = time.perf_counter()
            logits = models[name](x, cache=caches[name])[0]
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            mx.eval(mx.argmax(lp, axis=-1))
            dt = time.perf_counter() - t0
            trim_prompt_cache(caches[name], T)
            if rep:  # pass 0 warms each shape
                times[(name, T)].append(dt)
                spent += dt
        rep += 1
    return {job: min(v) for job, v in times.items()}


def verify_ratios(forward_s: dict) -> dict:
    """{k: time(k+1 positions) / time(1 position)}, made non-decreasing in k (a longer
    verify never costs less; a dip is timing noise)."""
    base = forward_s[1]
    out, best = {}, 1.0
    for T in sorted(forward_s):
        best = max(best, forward_s[T] / base)
        out[T - 1] = best
    return out


def advise(pair, prompts: list[Prompt], *, temp: float = 0.0, max_tokens: int = QUICK_MAX_TOKENS, max_k: int = 6,
           seed: int = 0, reps: int = 2, echo: Callable[[str], None] = print) -> dict:
    """Measure acceptance by position (drafting max_k per round) and the cost ratios, predict speed-up per k."""
    if pair.draft is None:
        raise MlxspecError("--quick measures a draft model against its target: load a pair (not --no-draft)")
    t0 = time.perf_counter()
    contender = MlxspecContender(f"mlxspec model k={max_k}", "model", max_k)
    from .api import encode_prompt

    contender.run(pair, encode_prompt(pair.tokenizer, "Say hello.", chat_template=True), temp=temp,
                  max_tokens=4, seed=seed)  # warm-up
    prop, acc, draft_time, drafted, verify_time, passes, tokens, gen_time = [0] * max_k, [0] * max_k, 0, 0, 0, 0, 0, 0
    ids_list = []
    for p in prompts:
        ids = encode(pair.tokenizer, p)
        ids_list.append(ids)
        run = contender.run(pair, ids, temp=temp, max_tokens=max_tokens, seed=seed)
        s = run.stats
        for i, (pp, aa) in enumerate(zip(s["proposed_by_position"], s["accepted_by_position"])):
            prop[i] += pp
            acc[i] += aa
        draft_time += s["draft_time"]
        drafted += s["draft_proposed"]
        verify_time += s["verify_time"]
        passes += s["target_passes"]
        tokens += s["generated_tokens"]
        gen_time += s["generation_time"]
        echo(f"  {p.key}: {s['generated_tokens']} tokens, acceptance {100 * s['acceptance_rate']:.0f}% "
             f"({_fmt_time(time.perf_counter() - t0)})")
    acc_by_pos = [a / p if p else 0.0 for a, p in zip(acc, prop)]
    a = per_token_acceptance(prop, acc)
    ctx = min(ids_list, key=len)
    sizes = list(range(1, max_k + 2))
    timed = time_forward({"target": pair.target, "draft": pair.draft}, ctx,
                         [("target", T) for T in sizes] + [("draft", 1)], reps)
    target_t = {T: timed[("target", T)] for T in sizes}
    draft_t = timed[("draft", 1)]
    # c from the drafter's real per-token cost in the runs (its sampling and loop overhead
    # included), the bare forward when the runs drafted nothing
    run_draft = draft_time / drafted if drafted else None
    c = (run_draft or draft_t) / target_t[1]
    verify_ratio = verify_ratios(target_t)
    rows = predict(acc_by_pos, a, c, verify_ratio)
    rec = recommend(rows)
    measured_tps = tokens / gen_time if gen_time else 0.0
    return {
        "temp": temp, "prompts": [p.key for p in prompts], "max_tokens": max_tokens, "max_k": max_k,
        "proposed_by_position": prop, "accepted_by_position": acc, "acceptance_by_position": acc_by_pos,
        "acceptance_rate": sum(acc) / sum(prop) if sum(prop) else 0.0, "per_token_acceptance": a,
        "target_step_s": target_t[1], "draft_forward_s": draft_t, "draft_step_s": run_draft or draft_t,
        "cost_ratio_c": c,
        "target_forward_s": {str(T): v for T, v in target_t.items()},
        "verify_ratio": {str(k): v for k, v in verify_ratio.items()},
        "run_verify_s": verify_time / passes if passes else None,
        "run_tokens_per_s": measured_tps,
        "run_speedup_vs_target_step": measured_tps * target_t[1],
        "predictions": rows, "recommendation": rec, "elapsed_s": time.perf_counter() - t0,
    }


def format_advice(adv: dict, pair_desc: str) -> str:
    rec = adv["recommendation"]
    lines = [
        f"Will it pay?  {pair_desc}",
        f"  target step {1000 * adv['target_step_s']:.1f} ms; draft step {1000 * adv['draft_step_s']:.1f} ms "
        f"in the runs ({1000 * adv['draft_forward_s']:.1f} ms bare forward): cost ratio c = {adv['cost_ratio_c']:.3f}",
        "  verify over k+1 positions / 1 position: "
        + ", ".join(f"k={k} {v:.2f}" for k, v in adv["verify_ratio"].items() if k != "0"),
        f"  acceptance by position (T={adv['temp']:g}, {len(adv['prompts'])} prompts, k={adv['max_k']}): "
        + " ".join(f"{100 * x:.0f}%" for x in adv["acceptance_by_position"])
        + f"; per-token a = {adv['per_token_acceptance']:.2f}",
        "",
        "   k  E[tokens/round]  (geometric)  cost/round  predicted speed-up  (geometric)",
    ]
    for r in adv["predictions"]:
        mark = "  <-" if rec.get("pays") and r["k"] == rec["k"] else ""
        lines.append(f"  {r['k']:2d}  {r['expected_tokens']:15.2f}  {r['expected_tokens_geometric']:11.2f}  "
                     f"{r['cost']:10.2f}  {r['speedup']:17.2f}x  {r['speedup_geometric']:10.2f}x{mark}")
    at_max = next((r for r in adv["predictions"] if r["k"] == adv["max_k"]), None)
    lines.append(f"  (check: drafting k={adv['max_k']}, the runs made {adv['run_tokens_per_s']:.2f} tok/s = "
                 f"{adv['run_speedup_vs_target_step']:.2f}x one target step per token"
                 + (f"; predicted {at_max['speedup']:.2f}x)" if at_max else ")"))
    lines.append("")
    if rec["pays"]:
        lines.append(f"Recommended: --num-draft {rec['k']} (predicted {rec['speedup']:.2f}x over plain decoding).")
    else:
        best = "-" if rec["speedup"] is None else f"{rec['speedup']:.2f}x at k={rec['best_k']}"
        lines.append(f"Recommended: --no-draft: speculation is not predicted to pay with this pair here "
                     f"(best {best}).")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# CLI


def _parse_temps(value: str) -> list[float]:
    try:
        temps = [float(t) for t in value.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter("comma-separated numbers, e.g. 0,0.7", param_hint="--temps")
    if not temps or any(t < 0 for t in temps):
        raise click.BadParameter("at least one temperature, none negative", param_hint="--temps")
    return temps


def _load_pair(model, draft, no_draft, pair_spec):
    from .loading import load

    if pair_spec:
        if model or draft:
            raise MlxspecError("give either --pair or --model/--draft, not both")
        if "," in pair_spec:
            model, draft = (s.strip() for s in pair_spec.split(",", 1))
        else:
            model = pair_spec
    return load(model, draft, no_draft=no_draft)


def _default_out() -> Path:
    return Path("mlxspec-bench") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def _command() -> str:
    argv = list(sys.argv)
    prog = Path(argv[0]).name if argv else "mlxspec"
    if prog == "run.py":
        return shlex.join(["python", argv[0]] + argv[1:])
    if prog != "mlxspec":
        prog = "mlxspec bench" if "bench" not in argv[1:2] else "mlxspec"
    return shlex.join([prog] + argv[1:])


@click.command()
@model_options
@click.option("--pair", "pair_spec", default=None,
              help="A pair folder (from `mlxspec convert`) or TARGET,DRAFT (same forms as --model/--draft).")
@click.option("--suite", "suites", default=",".join(DEFAULT_SUITES), show_default=True,
              help="Comma-separated suite names or paths to suite .json files.")
@click.option("--prompts", "prompts_per_suite", type=int, default=2, show_default=True,
              help="Prompts per suite (the first N; 0 = all).")
@click.option("--temps", default="0", show_default=True, help="Comma-separated temperatures, e.g. 0,0.7.")
@click.option("--repeats", type=int, default=1, show_default=True, help="Runs per prompt and contender (median).")
@click.option("--max-tokens", "-m", type=int, default=None,
              help=f"Tokens per generation [default: {DEFAULT_MAX_TOKENS}; {QUICK_MAX_TOKENS} with --quick].")
@click.option("--num-draft", "-k", type=int, default=3, show_default=True,
              help="k for fixed-k contenders (mlx-lm's default is 3).")
@click.option("--contenders", default=None,
              help="Comma-separated: plain, mlx-lm[:K], mlx-lm-plain, model|lookup|layerskip[:K|:auto]; or 'all' "
                   "[default: plain,mlx-lm,model, plus model:auto and lookup where this mlxspec has them].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for T > 0 (repeat r uses seed + r).")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: ./mlxspec-bench/<date-time>].")
@click.option("--quick", is_flag=True, help="Will it pay? Measure acceptance and cost ratios, predict speed-up per k.")
@click.option("--max-k", type=click.IntRange(1, 16), default=6, show_default=True,
              help="--quick: the largest k to consider.")
@click.option("--list", "list_only", is_flag=True, help="List the suites and contenders, then exit.")
def bench(model, draft, no_draft, pair_spec, suites, prompts_per_suite, temps, repeats, max_tokens, num_draft,
          contenders, seed, out, quick, max_k, list_only):
    """Benchmark speculative decoding against plain decoding and mlx-lm, or (--quick) predict whether it pays."""
    temps_list = _parse_temps(temps)
    if repeats < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeats")
    if not 1 <= num_draft <= 16:
        raise click.BadParameter("must be between 1 and 16", param_hint="--num-draft")
    suite_objs = [load_suite(s.strip()) for s in suites.split(",") if s.strip()]
    if not suite_objs:
        raise click.BadParameter("no suites given", param_hint="--suite")
    lineup = make_contenders(contenders, num_draft)
    if list_only:
        for s in suite_objs:
            click.echo(f"suite {s.name} ({len(s.prompts)} prompts, {s.path}): {s.description}")
            for p in s.prompts:
                click.echo(f"  {p.id}")
        click.echo("contenders: " + ", ".join(f"{c.name} [{c.spec}]" for c in lineup))
        return
    max_tokens = max_tokens or (QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS)
    if max_tokens < 2:
        raise click.BadParameter("must be at least 2", param_hint="--max-tokens")

    from .backend import describe

    echo = lambda s: click.echo(s, err=True)  # noqa: E731  (progress on stderr, results on stdout)
    t_load = time.perf_counter()
    pair = _load_pair(model, draft, no_draft, pair_spec)
    echo(f"[{pair.describe()}; {describe()}; loaded in {time.perf_counter() - t_load:.1f} s]")

    if quick:
        prompts = select_prompts(suite_objs, 1)
        adv = advise(pair, prompts, temp=temps_list[0], max_tokens=max_tokens, max_k=max_k, seed=seed, echo=echo)
        click.echo(format_advice(adv, pair.describe()))
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            doc = {"schema": SCHEMA + "/quick", "command": _command(),
                   "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   "machine": machine_info(), "versions": versions(), "pair": _pair_info(pair), **adv}
            (Path(out) / "quick.json").write_text(json.dumps(doc, indent=1))
            echo(f"wrote {Path(out) / 'quick.json'}")
        return

    load_start = machine_info()["load_average"]
    prompts = select_prompts(suite_objs, prompts_per_suite)
    result = run_benchmark(pair, prompts, lineup, temps=temps_list, repeats=repeats, max_tokens=max_tokens,
                           seed=seed, echo=echo)
    doc = {
        "schema": SCHEMA,
        "command": _command(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "load_average_start": load_start,
        "versions": versions(),
        "pair": _pair_info(pair),
        "config": {"suites": [s.name for s in suite_objs], "suite_files": [s.path for s in suite_objs],
                   "prompts_per_suite": prompts_per_suite, "temps": temps_list, "repeats": repeats,
                   "max_tokens": max_tokens, "num_draft": num_draft,
                   "contenders": ",".join(c.spec for c in lineup), "seed": seed,
                   "warmup_tokens": WARMUP_TOKENS, "chat_template": bool(getattr(pair.tokenizer, "chat_template", None))},
        **result,
    }
    click.echo(format_table(doc["summary"]))
    paths = write_outputs(doc, Path(out) if out else _default_out(), echo)
    click.echo("wrote " + ", ".join(paths.values()))


def _pair_info(pair) -> dict:
    return {"describe": pair.describe(), "target": str(pair.target_path),
            "draft": str(pair.draft_path) if pair.draft_path else None,
            "target_model_type": pair.target_config.get("model_type"),
            "draft_model_type": (pair.draft_config or {}).get("model_type"),
            "compatibility": pair.compatibility.to_dict() if pair.compatibility is not None else None}


def main(argv=None):
    """`python benchmarks/run.py ...` == `mlxspec bench ...`"""
    from .cli import main as cli_main

    cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])
