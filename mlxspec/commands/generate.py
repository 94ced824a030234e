"""`mlxspec generate`: one prompt, streamed or as JSON, with acceptance figures.

Every option is checked while the command line is parsed (core/options.py), before
anything is loaded.  Ctrl-C at any moment keeps what was generated: the partial
text, a summary saying "interrupted", exit 130.  The summary line ends with the
finish reason (stop, length, context, interrupted)."""

from __future__ import annotations

import json
import sys

import click

from ..commands.distributed_option import join, pipeline_option
from ..commands.profile_option import cost_profile_option
from ..commands.options import draft_options, kv_bits_options, max_kv_size_option, max_tokens_option, model_options, sampling_kwargs, sampling_options, typed

INTERRUPTED = 130


def parse_num_draft(value):
    """'auto', None or a draft length 0-16 (core/options.py's rule); kept for callers of the old name."""
    return typed("num_draft").convert(value, None, None)


def parse_draft_vocab(value):
    return typed("draft_vocab").convert(value, None, None)


QUIET = []  # --quiet: set while a command runs


def _say(text: str) -> None:
    if not QUIET:
        click.echo(text, err=True)


def mx_reset_peak():
    import mlx.core as mx

    mx.reset_peak_memory()


def mx_peak_gb() -> float:
    import mlx.core as mx

    return mx.get_peak_memory() / 2**30


@click.command()
@model_options
@click.option("--prompt", "-p", required=True, help="Prompt text ('-' reads standard input).")
@max_tokens_option(256)
@sampling_options
@draft_options
@max_kv_size_option
@kv_bits_options
@cost_profile_option()
@pipeline_option
@click.option("--ignore-chat-template", is_flag=True, help="Feed the prompt as raw text.")
@click.option("--system-prompt", "--system", "system", default=None, help="A system message (chat template only; --system: the old name).")
@click.option("--show-prompt", is_flag=True, help="Print the prompt as the model sees it (template applied) to stderr.")
@click.option("--verbose/--quiet", "verbose", default=True,
              help="--quiet: print only the generated text (no header or summary lines).")
@click.option("--compare", is_flag=True,
              help="Also measure plain target decoding (warm-up, interleaved repeats) and report the speed-up.")
@click.option("--compare-repeats", type=typed("repeats"), default=3, show_default=True,
              help="With --compare: timed runs of each side.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, stats.")
def generate(model, draft, no_draft, prompt, max_tokens, num_draft, num_draft_max, drafter, draft_p_min,
             draft_vocab, tree, max_kv_size, ignore_chat_template, system, show_prompt, verbose, compare,
             compare_repeats, as_json, cost_profile=None, kv_bits=None, kv_group_size=64, pipeline=False, **opts):
    """Generate text from a prompt, speculatively."""
    if prompt == "-":
        prompt = sys.stdin.read()
    if ignore_chat_template and not prompt:
        raise click.BadParameter("is empty: with --ignore-chat-template the model needs some text to continue",
                                 param_hint="'--prompt' / '-p'")
    if ignore_chat_template and system is not None:
        raise click.BadParameter("needs the chat template (drop --ignore-chat-template)", param_hint="'--system-prompt'")
    QUIET[:] = [] if verbose else [True]
    from ..api import encode_prompt, stream_generate
    from ..device import describe
    from ..models.loading import load
    from ..core.stats import GenerationStats

    needs_draft = drafter in (None, "model", "hybrid") or draft is not None  # lookup/layerskip use no draft model
    shard = join(pipeline, drafter)  # under mlx.launch: the target split over the ranks (distributed/)
    pair = load(model, draft, no_draft=(no_draft and not compare) or not needs_draft, shard=shard)
    if shard is not None and shard.rank:
        return shard.follow(pair.target)  # ranks >= 1 follow rank 0's target passes, and print nothing
    decoder_kw = dict(drafter="none" if no_draft else drafter, num_draft=num_draft, p_min=draft_p_min,
                      draft_vocab=draft_vocab, num_draft_max=num_draft_max, tree=tree, max_kv_size=max_kv_size,
                      cost_profile=cost_profile, kv_bits=kv_bits, kv_group_size=kv_group_size)
    sampling = sampling_kwargs(opts)
    stream, interrupted, ids = None, False, []
    try:
        text = prompt if system is None else [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        ids = encode_prompt(pair.tokenizer, text, not ignore_chat_template, pair.vocab_size)
        if show_prompt:
            click.echo(pair.tokenizer.decode(ids), err=True)
        mx_reset_peak()
        stream = stream_generate(pair, ids, max_tokens=max_tokens, **decoder_kw, **sampling)
        if as_json:
            stream.stats.rounds = []  # stats.rounds: each round's work (positions per forward), for pricing
        _say(f"[{pair.describe()}; {describe()}]")  # after the prompt and settings passed their checks
        for chunk in stream:
            if not as_json:
                click.echo(chunk.text, nl=False)
    except KeyboardInterrupt:
        interrupted = True
        if stream is not None:
            stream.close()
    stats = stream.stats if stream is not None else GenerationStats()
    if interrupted:
        stats.finish_reason = "cancelled"
    if not as_json:
        click.echo()
        _say(f"[{stats.summary()}; peak memory {mx_peak_gb():.2f} GB]")
        if stats.finish_reason == "context":
            _say(f"[stopped at the model's context limit ({pair.context_length} tokens): "
                 f"{stats.generated_tokens} of the {max_tokens} tokens asked for were generated]")
    out = {"text": stream.text if stream else "", "tokens": stream.tokens if stream else [],
           "peak_memory_bytes": int(mx_peak_gb() * 2**30),
           "finish_reason": stats.finish_reason, "stats": stats.to_dict(), "backend": describe(),
           "pair": pair.describe()}
    if compare and not interrupted and stream is not None:
        interrupted = _compare(pair, ids, decoder_kw, sampling, max_tokens, compare_repeats, out, as_json)
    if as_json:
        out["interrupted"] = interrupted
        click.echo(json.dumps(out))
    if interrupted:
        _say("interrupted")
        sys.exit(INTERRUPTED)


def _compare(pair, ids, decoder_kw, sampling, max_tokens, repeats, out, as_json) -> bool:
    """Run --compare into `out`; True when Ctrl-C stopped it."""
    from ..bench import compare as bench_compare

    try:
        c = bench_compare.compare(pair, ids, decoder_kw, sampling, max_tokens=max_tokens, repeats=repeats, echo=_say)
    except KeyboardInterrupt:
        out["compare"] = None
        _say("[--compare interrupted: no speed-up figure]")
        return True
    last = c["runs"][-1]
    out["compare"] = {k: v for k, v in c.items() if k != "runs"}
    out["compare"]["runs"] = [{k: v for k, v in r.items() if not k.endswith("_stats")} for r in c["runs"]]
    out["plain"] = {"stats": last["plain_stats"], "same_text": c["same_tokens"]}
    out["speedup"] = c["speedup"]
    if not as_json:
        _say(f"[{bench_compare.describe(c)}]")
    return False

