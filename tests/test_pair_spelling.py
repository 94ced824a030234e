"""One way to name a pair in every command (issue 61): `--pair FOLDER|TARGET,DRAFT` means
what `--model`/`--draft-model` mean, in generate, chat, serve, bench and calibrate alike;
both at once is a one-line usage error (exit 2) before anything is loaded."""

from __future__ import annotations

import json

import pytest

from cli_util import assert_refused, run_cli
from mlxspec.cli import COMMANDS, cli


def test_every_command_that_loads_a_pair_takes_pair_and_model():
    import click

    ctx = click.Context(cli)
    for name in ("generate", "chat", "serve", "bench", "calibrate"):
        opts = {o for p in cli.get_command(ctx, name).params for o in getattr(p, "opts", [])}
        assert {"--pair", "--model", "--draft", "--draft-model"} <= opts, name
    assert "generate" in COMMANDS


def test_pair_target_comma_draft_is_model_and_draft(tmp_path, tiny_pair_dirs):
    """`generate --pair T,D` drafts with D for T: its tokens are what --model T --draft-model D
    gives (the API with the same pair, in process), and the draft really drafted."""
    import mlxspec

    t, d = map(str, tiny_pair_dirs)
    a = run_cli(tmp_path, "generate", "--pair", f"{t},{d}", "-p", "w1 w2 w3", "-m", "12", "--num-draft", "3",
                "--json", "--no-tree", "--ignore-chat-template")
    assert a.returncode == 0, a.stderr
    ja = json.loads(a.stdout)
    b = mlxspec.generate(mlxspec.load(t, d), "w1 w2 w3", max_tokens=12, num_draft=3, tree=False, chat_template=False)
    assert ja["tokens"] == b.tokens and len(ja["tokens"]) == 12
    assert ja["stats"]["draft_accepted"] > 0  # the draft named by --pair really drafted


def test_pair_beside_model_is_one_usage_line(tmp_path):
    res = run_cli(tmp_path, "generate", "--pair", "a,b", "--model", "c", "-p", "x", timeout=60)
    assert_refused(res, "--pair", exit_code=2)


@pytest.mark.parametrize("cmd", ["chat", "bench", "serve", "calibrate"])
def test_every_command_refuses_pair_beside_model(cmd):
    from click.testing import CliRunner

    res = CliRunner().invoke(cli, [cmd, "--pair", "a,b", "--draft", "c"])
    assert res.exit_code == 2 and "give either --pair or --model/--draft, not both" in res.output, res.output
