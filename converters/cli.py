"""Click commands `mlxspec convert` and `mlxspec pairs` (mapped lazily by mlxspec/cli.py)."""

from __future__ import annotations

import click

from mlxspec.models import memory
from mlxspec.commands.options import typed

from . import catalog
from .convert import DEFAULT_CONTEXT, QUANTIZE_CHOICES, convert_pair


@click.command()
@click.argument("target")
@click.option("--draft", "-d", required=True, help="Draft model repo (same tokenizer family, smaller).")
@click.option("-o", "--output", "output", default=None,
              help="Pair folder to write [default: ./<target-name>+<draft-name>].")
@click.option("--quantize", "-q", type=click.Choice(QUANTIZE_CHOICES), default=None,
              help="Weight bits [default: 4 on Metal, none on the CPU backend].")
@click.option("--context", type=typed("context"), default=DEFAULT_CONTEXT, show_default=True,
              help="Tokens of KV cache to budget for.")
@click.option("--budget", type=typed("budget"), default=None,
              help="Memory budget in GiB [default: this device's usable memory].")
@click.option("--revision", default=None, help="Target branch, tag or commit [default: main].")
@click.option("--draft-revision", default=None, help="Draft branch, tag or commit [default: main].")
def convert(target, draft, output, quantize, context, budget, revision, draft_revision):
    """Convert TARGET and its --draft from the Hugging Face Hub into one pair folder.

    Checks tokenizer compatibility and the memory budget before downloading any
    weights.  Honours HF_ENDPOINT, HF_HOME, HF_TOKEN and HF_HUB_OFFLINE."""
    convert_pair(target, draft, output, quantize, context, budget, revision, draft_revision, log=click.echo)


@click.command()
@click.option("--context", type=typed("context"), default=DEFAULT_CONTEXT, show_default=True, help="Tokens of KV cache to budget for.")
@click.option("--budget", type=typed("budget"), default=None, help="Memory budget in GiB [default: this device's usable memory].")
def pairs(context, budget):
    """Known-good draft/target pairs, their memory needs, and whether they fit here."""
    from mlxspec.device import describe

    rows, usable, source = catalog.estimates(context, budget)
    click.echo(f"Known-good pairs; memory for both models plus KV caches at a {context}-token context.")
    click.echo(f"This machine: {describe()}; usable {memory.fmt_bytes(usable)} ({source}).")
    click.echo("4-bit: what Metal runs by default.  float32: what the CPU backend computes in "
               "(mlx-community 4-bit repos stay 4-bit there).\n")
    click.echo(catalog.table(rows))
    click.echo("\n* gated: accept the licence on the Hub and set HF_TOKEN first.")
    click.echo("Convert one with: mlxspec convert TARGET --draft DRAFT [--quantize 4|8|none]")
