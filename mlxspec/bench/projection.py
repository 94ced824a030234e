"""Projected speed-ups (`mlxspec bench --profile NAME`): each contender's recorded work,
priced by a cost profile (costs/profiles.py).

The contenders run for real on this machine; mlxspec's decide by the profile's costs
(`cost_profile=`).  Every run's work is a list of rounds, (widths of the draft's forwards,
positions of the target's pass, tokens emitted):

* mlxspec: `GenerationStats.rounds`, recorded by the loop (no clock);
* plain: one target step per token (mlxspec's plain rounds are exactly that);
* mlx-lm k: rebuilt from its from_draft flags (`mlxlm_work`);

and a run's projected speed-up is what plain decoding would pay for its tokens (one plain
step a token, and one for the EOS when the run stopped there) over their price.  Per
contender: the median over repeats, then over prompts, as the measured speed-up is taken
(bench/figures.py).  As the measured rate (bench/contenders.timing_figures), the rounds
that produced the first round's tokens are left out: they come with the prompt.
"""

from __future__ import annotations

from ..costs.profiles import price, round_parts
from .figures import median


def mlxlm_work(from_draft: list, k: int, max_tokens: int) -> list[tuple]:
    """mlx-lm's rounds (bench/contenders.mlxlm_parse) as work: a round drafts nd = min(k,
    tokens left) tokens in nd draft forwards of one position each -- two for the first after
    a round that kept every draft (the last draft was never fed) -- and verifies nd + 1
    positions in one target pass."""
    from .contenders import mlxlm_parse

    rounds, full = [], False
    for nd, acc, own in mlxlm_parse(from_draft, k, max_tokens):
        widths = tuple([2 if full else 1] + [1] * (nd - 1)) if nd else ()
        rounds.append((widths, nd + 1, acc + own))
        full = nd > 0 and acc == nd
    return rounds


def after_first_round(work: list, first_tokens: int) -> list:
    """The rounds after those that emitted the first `first_tokens` tokens."""
    i = 0
    while first_tokens > 0 and i < len(work):
        first_tokens -= round_parts(work[i])[2]
        i += 1
    return work[i:]


def run_work(record: dict, contender: dict, max_tokens: int) -> list | None:
    """The rounds of one bench record (None when they were not recorded)."""
    if contender.get("kind") == "mlx-lm":
        k = contender.get("num_draft")
        if not k:
            return [((), 1, 1)] * len(record["tokens"])
        return mlxlm_work(record["from_draft"], int(k), max_tokens)
    stats = record.get("mlxspec_stats") or {}
    return stats.get("rounds")


def project(records: list[dict], contenders: list[dict], costs: dict, max_tokens: int) -> list[dict]:
    """Rows (temp, suite, contender, projected, runs) -- `costs`: contender name -> the CostModel
    its work is priced by.  Adds `projected_speedup` to each record."""
    by_name = {c["name"]: c for c in contenders}
    for r in records:
        work, cm = run_work(r, by_name.get(r["contender"], {}), max_tokens), costs.get(r["contender"])
        r["projected_speedup"] = None
        work = after_first_round(work, r.get("first_round_tokens", 0)) if work else work
        if work and cm is not None:
            tokens, cost = price(work, cm)
            plain = tokens + (r.get("finish_reason") == "stop")  # plain decoding pays a step for the EOS too
            r["projected_speedup"] = plain / cost if cost > 0 else None
    rows = []
    temps = sorted({r["temp"] for r in records})
    suites = list(dict.fromkeys(r["suite"] for r in records))
    for temp in temps:
        for suite in suites + (["all"] if len(suites) > 1 else []):
            for c in [c["name"] for c in contenders]:
                mine = [r for r in records if r["temp"] == temp and r["contender"] == c
                        and (suite == "all" or r["suite"] == suite) and r["projected_speedup"] is not None]
                if not mine:
                    continue
                per_prompt = {}
                for r in mine:
                    per_prompt.setdefault(r["prompt"], []).append(r["projected_speedup"])
                rows.append({"temp": temp, "suite": suite, "contender": c, "runs": len(mine),
                             "projected_speedup": median([median(v) for v in per_prompt.values()])})
    return rows


def format_projection(rows: list[dict], summary: list[dict], profile: str) -> str:
    """The projected speed-ups beside the measured ones."""
    measured = {(s["temp"], s["suite"], s["contender"]): s for s in summary}
    head = ("suite", "contender", "measured", f"projected ({profile})", "tok/pass")
    out = []
    for temp in sorted({r["temp"] for r in rows}):
        table = []
        for r in rows:
            if r["temp"] != temp:
                continue
            m = measured.get((temp, r["suite"], r["contender"]), {})
            sp, tpp = m.get("speedup"), m.get("mean_accepted_length")
            table.append([r["suite"], r["contender"], "-" if sp is None else f"{sp:.2f}x",
                          f"{r['projected_speedup']:.2f}x", "-" if tpp is None else f"{tpp:.2f}"])
        widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
        out.append(f"temperature {temp:g}: measured on this machine (decisions by {profile}); projected: the same "
                   f"runs' work priced by {profile}")
        fmt = lambda row: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
        out += [fmt(head), "-" * len(fmt(head))] + [fmt(t) for t in table] + [""]
    return "\n".join(out)
