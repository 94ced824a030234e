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

The parts: bench/prompts.py (suites), bench/contenders.py (what runs, timed alike),
bench/figures.py (speed-ups, the greedy check), bench/runner.py (the interleaved
runs), bench/report.py (table, markdown, chart, JSON), bench/advisor.py (--quick).
This file is the command.

Prompt suites are JSON files (benchmarks/suites/*.json in a checkout, or
mlxspec/bench_suites/ when packaged; $MLXSPEC_BENCH_SUITES overrides); --suite
also takes a path to a suite file.
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import click

from ..bench.advisor import QUICK_MAX_TOKENS, QUICK_PROMPTS, advise, expected_tokens, expected_tokens_geometric, format_advice, per_token_acceptance, policy_round, predict, recommend
from ..bench.contenders import ALL_CONTENDERS, DRAFTERS, Contender, MlxLmContender, MlxspecContender, Run, default_contenders, first_round_tokens, make_contender, make_contenders, mlxlm_rounds, parse_k, position_counts, timing_figures
from ..bench.figures import check_greedy, first_divergence, median, pairwise_speedup, summarize  # noqa: F401
from ..bench.prompts import Prompt, Suite, encode, find_suite_file, load_suite, parse_suite, select_prompts  # noqa: F401
from ..bench.report import format_table, machine_info, markdown, versions, write_outputs  # noqa: F401
from ..bench.runner import DEFAULT_MAX_TOKENS, WARMUP_TOKENS, run_benchmark  # noqa: F401

DEFAULT_PROMPTS = 2  # per suite
from ..errors import MlxspecError
from ..core.options import MAX_NUM_DRAFT, BadValue, check
from ..commands.options import model_options, sampling_choice_option, typed
from ..commands.profile_option import cost_profile_option

SCHEMA = "mlxspec-bench/1"
DEFAULT_SUITES = ("code", "chat", "grounded", "creative")


def _parse_temps(ctx, param, value: str) -> list[float]:
    try:
        temps = [float(t) for t in value.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter("comma-separated numbers, e.g. 0,0.7")
    if not temps:
        raise click.BadParameter("at least one temperature")
    try:
        return [check("temp", t) for t in temps]
    except BadValue as e:
        raise click.BadParameter(f"each temperature {e.rule}, got {e.value:g}")


def _load_pair(model, draft, no_draft):
    from ..models.loading import load

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
@click.option("--suite", "suites", default=",".join(DEFAULT_SUITES), show_default=True,
              help="Comma-separated suite names or paths to suite .json files.")
@click.option("--prompts", "prompts_per_suite", type=click.IntRange(0), default=None,
              help=f"Prompts per suite (the first N; 0 = all) [default: {DEFAULT_PROMPTS}; "
                   f"{QUICK_PROMPTS} with --quick].")
@click.option("--temps", default="0", callback=_parse_temps, show_default=True,
              help="Comma-separated temperatures, e.g. 0,0.7.")
@click.option("--repeats", type=typed("repeats"), default=1, show_default=True,
              help="Runs per prompt and contender (median).")
@click.option("--max-tokens", "-m", type=click.IntRange(2), default=None,
              help=f"Tokens per generation [default: {DEFAULT_MAX_TOKENS}; {QUICK_MAX_TOKENS} with --quick].")
@click.option("--num-draft", "-k", type=click.IntRange(1, MAX_NUM_DRAFT), default=3, show_default=True,
              help="k for fixed-k contenders (mlx-lm's default is 3).")
@click.option("--contenders", default=None,
              help="Comma-separated: plain, mlx-lm[:K], mlx-lm-plain, model|lookup|layerskip[:K|:auto][:chain] "
                   "(':chain': verify chains, not trees); or 'all' [default: plain,mlx-lm,model, plus model:auto, "
                   "model:auto:chain and lookup where this mlxspec has them].")
@click.option("--seed", type=typed("seed"), default=0, show_default=True, help="Seed for T > 0 (repeat r uses seed + r).")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: ./mlxspec-bench/<date-time>].")
@click.option("--quick", is_flag=True, help="Will it pay? Measure acceptance and cost ratios, predict speed-up per k.")
@click.option("--max-k", type=click.IntRange(1, MAX_NUM_DRAFT), default=6, show_default=True,
              help="--quick: the largest k to consider.")
@click.option("--list", "list_only", is_flag=True, help="List the suites and contenders, then exit.")
@sampling_choice_option
@cost_profile_option("--profile", "--cost-profile",
                     help_extra=" Prints each contender's projected speed-up there (its recorded work priced by the "
                                "profile) beside the measured one.")
def bench(model, draft, no_draft, suites, prompts_per_suite, temps, repeats, max_tokens, num_draft,
          contenders, seed, out, quick, max_k, list_only, cost_profile=None, sampling=None):
    """Benchmark speculative decoding against plain decoding and mlx-lm, or (--quick) predict whether it pays."""
    temps_list = temps
    if quick and no_draft:
        raise click.UsageError("--quick measures a draft model against its target: drop --no-draft")
    suite_objs = [load_suite(s.strip()) for s in suites.split(",") if s.strip()]
    if not suite_objs:
        raise click.BadParameter("no suites given", param_hint="--suite")
    lineup = make_contenders(contenders, num_draft)
    for c in lineup:
        if isinstance(c, MlxspecContender):
            c.cost_profile = cost_profile  # None / this-machine: the calibration
            c.sampling = sampling  # None: coupled (the run always has a seed); rejection on request
    if list_only:
        for s in suite_objs:
            click.echo(f"suite {s.name} ({len(s.prompts)} prompts, {s.path}): {s.description}")
            for p in s.prompts:
                click.echo(f"  {p.id}")
        click.echo("contenders: " + ", ".join(f"{c.name} [{c.spec}]" for c in lineup))
        return
    max_tokens = max_tokens or (QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS)
    if prompts_per_suite is None:
        prompts_per_suite = QUICK_PROMPTS if quick else DEFAULT_PROMPTS

    from ..device import describe

    echo = lambda s: click.echo(s, err=True)  # noqa: E731  (progress on stderr, results on stdout)
    t_load = time.perf_counter()
    pair = _load_pair(model, draft, no_draft)
    echo(f"[{pair.describe()}; {describe()}; loaded in {time.perf_counter() - t_load:.1f} s]")

    if quick:
        prompts = select_prompts(suite_objs, prompts_per_suite)
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
                   "contenders": ",".join(c.spec for c in lineup), "seed": seed, "sampling": sampling or "coupled",
                   "warmup_tokens": WARMUP_TOKENS, "chat_template": bool(getattr(pair.tokenizer, "chat_template", None))},
        **result,
    }
    click.echo(format_table(doc["summary"]))
    if cost_profile is not None:
        doc["projection"] = _projection(pair, lineup, result, cost_profile, max_tokens)
        from ..bench.projection import format_projection

        click.echo(format_projection(doc["projection"]["rows"], doc["summary"], cost_profile))
    paths = write_outputs(doc, Path(out) if out else _default_out(), echo)
    click.echo("wrote " + ", ".join(paths.values()))
    if result.get("interrupted"):
        echo("interrupted")
        sys.exit(130)  # the runs done so far are reported; the exit status says they are not all


def _projection(pair, lineup, result, cost_profile, max_tokens) -> dict:
    """Every contender's recorded work priced by the profile (bench/projection.py): mlxspec's
    by the cost model its decoder decided by; fixed-k ones and mlx-lm's by the profile's
    (this-machine: the calibration's) costs for the pair's draft model."""
    from ..bench.projection import project
    from ..costs import cost_model, profiles

    prof = profiles.load_profile(cost_profile)
    model_cost = {}

    def for_model_draft(full_head: bool):
        """mlx-lm drafts with the draft model's whole head (`full_head`); mlxspec's fixed-k
        contenders with its pruned one: under this-machine each is priced by its own
        calibration (the whole head's step is 5-20 % dearer here)."""
        if full_head not in model_cost:
            from ..api import make_drafter

            d = make_drafter(pair, "model" if pair.draft is not None else "lookup",
                             draft_vocab="full" if full_head and pair.draft is not None else None)
            if prof is not None:
                model_cost[full_head] = prof.cost_model(d)
            else:
                from ..costs import calibration

                model_cost[full_head] = calibration.for_decoder(pair, d)
        return model_cost[full_head]

    active = {c["name"] for c in result["contenders"]}
    costs = {}
    for c in lineup:
        if c.name not in active:
            continue
        cm = getattr(c, "cost_used", None)
        if cm is None:  # plain decoding costs one plain step a token whatever the model
            cm = (cost_model.assumed(0.0) if c.drafter in (None, "none") and not c.num_draft
                  else for_model_draft(c.kind == "mlx-lm"))
        costs[c.name] = cm
    rows = project(result["runs"], result["contenders"], costs, max_tokens)
    return {"profile": cost_profile, "figures": prof.to_dict() if prof is not None else None,
            "costs": {k: v.describe() for k, v in costs.items()}, "rows": rows}


def _pair_info(pair) -> dict:
    return {"describe": pair.describe(), "target": str(pair.target_path),
            "draft": str(pair.draft_path) if pair.draft_path else None,
            "target_model_type": pair.target_config.get("model_type"),
            "draft_model_type": (pair.draft_config or {}).get("model_type"),
            "compatibility": pair.compatibility.to_dict() if pair.compatibility is not None else None}
