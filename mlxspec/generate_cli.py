"""`mlxspec generate`: one prompt, streamed or as JSON, with acceptance figures."""

from __future__ import annotations

import json
import sys

import click

from .api import generate as run_generate
from .api import stream_generate
from .backend import describe


def parse_num_draft(value):
    if value is None or value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise click.BadParameter("must be a whole number or 'auto'")
    if not 0 <= k <= 16:
        raise click.BadParameter("must be between 0 and 16")
    return k


def parse_draft_vocab(value):
    if value is None or value == "full":
        return value
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter("must be a number of tokens or 'full'")
    if n < 1:
        raise click.BadParameter("must be at least 1 (or 'full' for the whole vocabulary)")
    return n


def draft_options(f):
    """--num-draft/--num-draft-max/--drafter/--draft-p-min/--draft-vocab, shared by generate and chat."""
    f = click.option("--draft-vocab", default=None, callback=lambda c, p, v: parse_draft_vocab(v),
                     help="Tokens the draft's head scores: the N most frequent (FR-Spec; default "
                          "65536 when the vocabulary is larger), or 'full'.")(f)
    f = click.option("--draft-p-min", type=float, default=0.0,
                     help="Stop drafting when the draft's probability of its token is below this.")(f)
    f = click.option("--drafter", default=None,
                     help="model | hybrid (prompt lookup, then the draft model) | lookup (prompt n-grams, no "
                          "draft model) | layerskip (the target with layers skipped) | none (default: model "
                          "when a draft is loaded).")(f)
    f = click.option("--num-draft-max", type=click.IntRange(0, 16), default=None,
                     help="With --num-draft auto: the most tokens drafted per round (default 12; 0 = plain decoding).")(f)
    f = click.option("--num-draft", default=None,
                     help="Draft tokens per round, or 'auto' (default): draft token by token while the "
                          "calibrated cost model says it pays, falling back to plain decoding when it does not.")(f)
    return f


def model_options(f):
    """--model/--draft/--no-draft, shared by generate, chat and bench."""
    f = click.option("--no-draft", is_flag=True, help="Plain target decoding (same code path, for comparisons).")(f)
    f = click.option("--draft", "draft", default=None, help="Draft model (folder, .gguf, catalog name or cached repo id).")(f)
    f = click.option("--model", "model", default=None,
                     help="Target model or pair folder (default: the Qwen2.5-Coder 1.5B/0.5B pair).")(f)
    return f


def sampling_options(f):
    f = click.option("--seed", type=int, default=None, help="Random seed: the same seed gives the same output.")(f)
    f = click.option("--repetition-penalty", type=float, default=1.0, show_default=True)(f)
    f = click.option("--min-p", type=float, default=0.0, show_default=True)(f)
    f = click.option("--top-k", type=int, default=0, show_default=True)(f)
    f = click.option("--top-p", type=float, default=1.0, show_default=True)(f)
    f = click.option("--temp", type=float, default=0.0, show_default=True, help="0 = greedy.")(f)
    return f


def sampling_kwargs(o) -> dict:
    return dict(temp=o["temp"], top_p=o["top_p"], top_k=o["top_k"], min_p=o["min_p"],
                repetition_penalty=o["repetition_penalty"], seed=o["seed"])


@click.command()
@model_options
@click.option("--prompt", "-p", required=True, help="Prompt text ('-' reads standard input).")
@click.option("--max-tokens", "-m", type=int, default=256, show_default=True)
@sampling_options
@draft_options
@click.option("--ignore-chat-template", is_flag=True, help="Feed the prompt as raw text.")
@click.option("--compare", is_flag=True, help="Also run plain target decoding and report the speed-up.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, stats.")
def generate(model, draft, no_draft, prompt, max_tokens, num_draft, num_draft_max, drafter, draft_p_min,
             draft_vocab, ignore_chat_template, compare, as_json, **opts):
    """Generate text from a prompt, speculatively."""
    from .loading import load

    if prompt == "-":
        prompt = sys.stdin.read()
    num_draft = parse_num_draft(num_draft)
    needs_draft = drafter in (None, "model", "hybrid") or draft is not None  # lookup/layerskip use no draft model
    pair = load(model, draft, no_draft=(no_draft and not compare) or not needs_draft)
    kw = dict(max_tokens=max_tokens, num_draft=num_draft, drafter="none" if no_draft else drafter,
              p_min=draft_p_min, chat_template=not ignore_chat_template, draft_vocab=draft_vocab,
              num_draft_max=num_draft_max, **sampling_kwargs(opts))
    if not as_json:
        stream = stream_generate(pair, prompt, **kw)
        click.echo(f"[{pair.describe()}; {describe()}]", err=True)
        try:
            for chunk in stream:
                click.echo(chunk.text, nl=False)
        except KeyboardInterrupt:
            stream.close()
            click.echo("\n[interrupted]", err=True)
        click.echo()
        stats = stream.stats
        click.echo(f"[{stats.summary()}]", err=True)
        result_text, result_tokens = stream.text, stream.tokens
    else:
        res = run_generate(pair, prompt, **kw)
        stats, result_text, result_tokens = res.stats, res.text, res.tokens
    out = {"text": result_text, "tokens": result_tokens, "stats": stats.to_dict(), "backend": describe(),
           "pair": pair.describe()}
    if compare:
        plain = run_generate(pair, prompt, **{**kw, "drafter": "none"})
        speedup = stats.generation_tps / plain.stats.generation_tps if plain.stats.generation_tps else 0.0
        out["plain"] = {"stats": plain.stats.to_dict(), "same_text": plain.tokens == result_tokens}
        out["speedup"] = speedup
        if not as_json:
            click.echo(f"[plain target decoding: {plain.stats.generation_tps:.2f} tok/s; speculative: "
                       f"{stats.generation_tps:.2f} tok/s; speed-up {speedup:.2f}x; acceptance "
                       f"{100 * stats.acceptance_rate:.1f}%; identical output: {plain.tokens == result_tokens}]", err=True)
    if as_json:
        click.echo(json.dumps(out))
