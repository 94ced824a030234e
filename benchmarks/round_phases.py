"""Where a speculative round's time goes: token trees against chains, phase by phase.

    python benchmarks/round_phases.py                       # the code suite, 64 tokens, 2 repeats
    python benchmarks/round_phases.py --suite chat --prompts 0 --max-tokens 48

One process, the default pair loaded once.  Three decoders run interleaved on
each prompt, warm, in a rotating order per repeat: the default (token trees),
the default without prompt lookup's branches, and chains (`tree=False`).  Each
round is split into what it spends:

* draft forwards and target forwards, by the number of positions they run over
  (the padded width), with the seconds each took;
* the draft's distributions over a tree level, and the two caches' commits;
* the rest (Python: choosing nodes, the acceptance walk, bookkeeping).

To attribute time, each forward's logits are evaluated where the forward is
called (the loop evaluates them a few operations later) and each commit is
evaluated at once: the split is close, not exact, and the whole round is timed
too.  Prefill is not counted.  Then, to tell the tree machinery (mask, per-node
RoPE positions, commits) from the width it verifies, each model runs the same
positions as a chain forward and as a tree-block forward, interleaved, at
widths 1, 4, 8 and 13, --micro times each (0 skips it).  Every output must equal the
others on the same prompt (they are all the target's greedy output).
"""

from __future__ import annotations

import collections
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
import mlx.core as mx  # noqa: E402
from mlxspec import api, decoder as speculative
from mlxspec.core import cache
from mlxspec.trees import attention as tree_attention, drafter as tree_drafter  # noqa: E402
from mlxspec.core.stats import GenerationStats  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import arguments, chosen_prompts  # noqa: E402

MICRO_WIDTHS = (1, 4, 8, 13)


class NoLookup:
    """A prompt-lookup stand-in that never matches (trees without lookup branches)."""

    def reset(self):
        pass

    def lookup(self, *args):
        return []


class Phases:
    """Seconds and calls per (decoder, phase) while a round runs."""

    def __init__(self):
        self.seconds, self.calls = collections.Counter(), collections.Counter()
        self.name, self.decoder, self.in_round = None, None, False

    def add(self, phase: str, seconds: float):
        self.seconds[self.name, phase] += seconds
        self.calls[self.name, phase] += 1

    def model(self, state) -> str:
        return "target" if state is self.decoder.target else "draft"

    @contextlib.contextmanager
    def installed(self):
        """While open: the round functions, forwards, distributions and commits are
        wrapped to time them (restored on exit)."""
        ph = self

        def forward_of(fn, state_of):
            def wrapped(self, tokens, *args):
                if not ph.in_round:
                    return fn(self, tokens, *args)
                width = (args[-1] if args and args[-1] else None) or (
                    tokens.size if isinstance(tokens, mx.array) else len(tokens))
                t0 = time.perf_counter()
                out = fn(self, tokens, *args)
                mx.eval(out)
                ph.add(f"{ph.model(state_of(self))} forward x{width:02d}", time.perf_counter() - t0)
                return out
            return wrapped

        def commit(fn):
            def wrapped(self, path):
                t0 = time.perf_counter()
                fn(self, path)
                mx.eval([c.keys for c in self.state.cache if c.keys is not None] +
                        [c.values for c in self.state.cache if c.values is not None])
                ph.add(f"{ph.model(self.state)} commit", time.perf_counter() - t0)
            return wrapped

        def timed(fn, phase):
            def wrapped(*args, **kwargs):
                top = phase == "round"
                if not (top or ph.in_round):
                    return fn(*args, **kwargs)
                ph.in_round = True
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    ph.add(phase, time.perf_counter() - t0)
                    ph.in_round = not top
            return wrapped

        TB, MS, TD = tree_attention.TreeBlock, cache.ModelState, tree_drafter.TreeDraft
        SD = speculative.SpeculativeDecoder
        wrapped = [(TB, "forward", forward_of(TB.forward, lambda b: b.state)),
                   (MS, "forward", forward_of(MS.forward, lambda s: s)),
                   (TB, "commit", commit(TB.commit)),
                   (TD, "_distributions", timed(TD._distributions, "draft distributions")),
                   (speculative, "run_tree_round", timed(speculative.run_tree_round, "round")),
                   (SD, "_chain_round", timed(SD._chain_round, "round"))]
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in wrapped]
        try:
            for owner, name, fn in wrapped:
                setattr(owner, name, fn)
            yield self
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)

    def generate(self, name: str, decoder, ids: list[int], max_tokens: int) -> list[int]:
        """One greedy generation from a fresh cache, its rounds timed under `name`."""
        self.name, self.decoder = name, decoder
        decoder.reset()
        with self.installed():
            return [t for t, _ in decoder.generate(list(ids), max_tokens=max_tokens, stats=GenerationStats())]

    def report(self, name: str, tokens: int) -> dict:
        rounds = self.calls[name, "round"]
        rows = {}
        for (n, phase), s in sorted(self.seconds.items(), key=lambda kv: (kv[0][1] != "round", kv[0][1])):
            if n == name:
                rows[phase] = {"calls_per_round": round(self.calls[n, phase] / rounds, 3),
                               "ms_per_round": round(1000 * s / rounds, 1),
                               "ms_per_call": round(1000 * s / self.calls[n, phase], 1)}
        parts = sum(s for (n, p), s in self.seconds.items() if n == name and p != "round")
        rows["rest"] = {"ms_per_round": round(1000 * (self.seconds[name, "round"] - parts) / rounds, 1)}
        return {"rounds": rounds, "tokens": tokens, "tokens_per_round": round(tokens / rounds, 2), "phases": rows}


def micro(pair, history: list[int], repeats: int = 8) -> dict:
    """Chain forward against tree-block forward (a chain-shaped block) over the same
    positions, per model and width: minimum and median milliseconds."""
    out = {}
    for which, model in (("draft", pair.draft), ("target", pair.target)):
        state = cache.ModelState(model)
        state.prefill(history)

        def chain(n):
            state.sync(history)
            t0 = time.perf_counter()
            mx.eval(state.forward(history[-1:] + [history[-2]] * (n - 1)))
            return time.perf_counter() - t0

        def tree(n):
            state.sync(history)
            block = tree_attention.TreeBlock(state)
            t0 = time.perf_counter()
            mx.eval(block.forward(history[-1:] + [history[-2]] * (n - 1), list(range(-1, n - 1))))
            seconds = time.perf_counter() - t0
            block.commit([])
            return seconds

        for n in MICRO_WIDTHS:
            times = {"chain": [], "tree": []}
            for r in range(repeats):
                for f in ((chain, tree) if r % 2 else (tree, chain)):
                    f(n)  # a warm-up call of the same shape
                    times[f.__name__].append(f(n))
            out[f"{which} x{n:02d}"] = {k: {"min_ms": round(1000 * min(v), 1),
                                            "median_ms": round(1000 * statistics.median(v), 1)}
                                        for k, v in times.items()}
    return out


def main() -> int:
    args = arguments(__doc__, "0", 64, "round-phases.json", repeats=2, micro=8)
    pair = mlxspec.load()
    decoders = {"trees": api.make_decoder(pair), "trees without lookup": api.make_decoder(pair),
                "chains": api.make_decoder(pair, tree=False)}
    decoders["trees without lookup"].lookup = NoLookup()
    phases = Phases()
    names, tokens, outputs, identical = list(decoders), collections.Counter(), {}, True
    prompts = chosen_prompts(args)
    for rep in range(args.repeats):
        for i, p in enumerate(prompts):
            ids = api.encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
            turn = (rep + i) % len(names)
            for name in names[turn:] + names[:turn]:
                out = phases.generate(name, decoders[name], ids, args.max_tokens)
                tokens[name] += len(out)
                identical &= outputs.setdefault(p["id"], out) == out
            print(f"repeat {rep + 1}/{args.repeats}: {p['id']}", flush=True)
    result = {"suite": args.suite, "prompts": [p["id"] for p in prompts], "max_tokens": args.max_tokens,
              "repeats": args.repeats, "cost_model": decoders["trees"].policy.cost.describe(),
              "decoders": {n: phases.report(n, tokens[n]) for n in names}, "outputs_identical": identical}
    if args.micro:
        history = api.encode_prompt(pair.tokenizer, prompts[0]["prompt"], chat_template=True)
        result["chain_vs_tree_forward"] = micro(pair, history, args.micro)
    args.out.write_text(json.dumps(result, indent=1))
    for name, r in result["decoders"].items():
        print(f"== {name}: {r['rounds']} rounds, {r['tokens_per_round']} tokens per round")
        for phase, v in r["phases"].items():
            calls = f"{v['calls_per_round']:5.2f} calls x {v['ms_per_call']:6.1f} ms = " if "calls_per_round" in v else " " * 23
            print(f"   {phase:22s} {calls}{v['ms_per_round']:6.1f} ms per round")
    for k, v in result.get("chain_vs_tree_forward", {}).items():
        print(f"{k}: chain {v['chain']['min_ms']} / {v['chain']['median_ms']} ms, "
              f"tree block {v['tree']['min_ms']} / {v['tree']['median_ms']} ms (min / median)")
    print("all outputs identical" if identical else "OUTPUTS DIFFER")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
