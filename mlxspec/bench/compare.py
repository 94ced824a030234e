"""`mlxspec generate --compare`: speculative against plain decoding on the user's own prompt,
measured the way `mlxspec bench` measures (bench/contenders.py): one short warm-up run of
each, then `repeats` runs of each, interleaved in alternating order so that drift of a
shared machine hits both alike, each timed by its decode rate after the first round.
The speed-up is the median of the per-repeat ratios; their range is the spread, and a
figure whose range straddles 1x (or whose distance from 1x is smaller than half the
range) is reported as within noise."""

from __future__ import annotations

import statistics
from typing import Callable

from .contenders import MlxspecContender, timing_figures

WARMUP_TOKENS = 8
WARMUP_PROMPT = 64  # tokens of the prompt the warm-up runs read


class SettingsContender(MlxspecContender):
    """mlxspec with the user's generate settings (drafter, draft length, sampling)."""

    def __init__(self, name: str, decoder_kw: dict, sampling: dict):
        super().__init__(name, decoder_kw.get("drafter") or "model", decoder_kw.get("num_draft"))
        self.decoder_kw, self.sampling = decoder_kw, sampling

    def decoder(self, pair):
        from ..api import make_decoder

        return make_decoder(pair, **self.decoder_kw)

    def stream(self, pair, ids, temp, max_tokens, seed, info):
        from ..api import stream_generate

        stream = stream_generate(pair, ids, max_tokens=max_tokens, decoder=self.decoder(pair),
                                 **{**self.sampling, "seed": seed})
        info["stats"] = stream.stats
        for chunk in stream:
            if chunk.token >= 0:
                yield chunk.token, chunk.from_draft


def spread_verdict(ratios: list[float]) -> dict:
    """Median, range and whether the speed-up is distinguishable from 1x."""
    med = statistics.median(ratios)
    lo, hi = min(ratios), max(ratios)
    noise = len(ratios) < 2 or lo <= 1.0 <= hi or abs(med - 1.0) < (hi - lo) / 2
    return {"speedup": med, "min": lo, "max": hi, "repeats": len(ratios), "within_noise": noise}


def compare(pair, ids: list[int], decoder_kw: dict, sampling: dict, *, max_tokens: int, repeats: int = 3,
            echo: Callable[[str], None] = print) -> dict:
    temp = sampling.get("temp", 0.0)
    seed = sampling.get("seed") or 0
    spec = SettingsContender("speculative", decoder_kw, sampling)
    plain = SettingsContender("plain", {**decoder_kw, "drafter": "none", "num_draft": None}, sampling)
    for c in (spec, plain):
        c.run(pair, ids[:WARMUP_PROMPT], temp=temp, max_tokens=WARMUP_TOKENS, seed=seed)
    runs = []
    for r in range(repeats):
        order = (spec, plain) if r % 2 == 0 else (plain, spec)
        got = {c.name: c.run(pair, ids, temp=temp, max_tokens=max_tokens, seed=seed) for c in order}
        fig = {name: timing_figures(run.token_times, run.from_draft, run.total_time) for name, run in got.items()}
        tps = {name: f["decode_tps"] for name, f in fig.items()}
        ratio = tps["speculative"] / tps["plain"] if tps["plain"] else 0.0
        runs.append({"plain_tps": tps["plain"], "speculative_tps": tps["speculative"], "speedup": ratio,
                     "same_tokens": got["plain"].tokens == got["speculative"].tokens,
                     "plain_stats": got["plain"].stats, "speculative_stats": got["speculative"].stats})
        echo(f"[compare {r + 1}/{repeats}: plain {tps['plain']:.2f} tok/s, speculative {tps['speculative']:.2f} "
             f"tok/s: {ratio:.2f}x]")
    verdict = spread_verdict([r["speedup"] for r in runs])
    near = {side: _near_ties(runs[-1][f"{side}_stats"]) for side in ("plain", "speculative")}
    return {**verdict, "near_ties": near if temp == 0 else None, "plain_tps": statistics.median(r["plain_tps"] for r in runs),
            "speculative_tps": statistics.median(r["speculative_tps"] for r in runs),
            "same_tokens": all(r["same_tokens"] for r in runs), "greedy": temp == 0, "runs": runs,
            "method": f"{WARMUP_TOKENS}-token warm-up each, then {repeats} interleaved runs of each; decode rate "
                      "after the first round (as mlxspec bench)"}


def _near_ties(stats) -> int | None:
    """Greedy tokens whose two best logits were within the dtype's rounding (core/acceptance.py)."""
    return stats.get("near_ties") if isinstance(stats, dict) else getattr(stats, "near_ties", None)


def describe(c: dict) -> str:
    """The line --compare prints."""
    n = c["repeats"]
    rng = f"range {c['min']:.2f}x-{c['max']:.2f}x" if n > 1 else "one run, no spread"
    text = (f"speed-up {c['speedup']:.2f}x (median of {n} interleaved run{'s' if n > 1 else ''} after a warm-up; "
            f"{rng}); plain {c['plain_tps']:.2f} tok/s, speculative {c['speculative_tps']:.2f} tok/s")
    if c["greedy"]:
        text += f"; identical output: {c['same_tokens']}"
        near = c.get("near_ties") or {}
        if near.get("speculative"):
            text += f"; near-ties {near['speculative']} (where rounding may pick the other token)"
    if c["within_noise"]:
        text += ("; within noise: the runs do not agree which side is faster" if n > 1
                 else "; one run cannot tell a speed-up from noise (--compare-repeats 3)")
    return text
