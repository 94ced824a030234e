"""The public API is pinned: `mlxspec`'s exports and their signatures (functions, and
the public methods and properties of its classes), `from mlxspec.session import
Session`, and every `mlxspec` command with its options and arguments.  A change to
any of them fails here; if it is meant, update tests/public_api.json in the same
commit and say so in its message."""

import inspect
import json
from pathlib import Path

import click

import mlxspec
from mlxspec.cli import COMMANDS, cli

PINNED = Path(__file__).with_name("public_api.json")


def surface() -> dict:
    out = {"exports": sorted(mlxspec.__all__)}
    sigs = {}
    for name in mlxspec.__all__:
        obj = getattr(mlxspec, name)
        if callable(obj) and not isinstance(obj, type):
            sigs[name] = str(inspect.signature(obj))
        elif isinstance(obj, type):
            members = {}
            for m, v in vars(obj).items():
                if m.startswith("_") and m != "__init__":
                    continue
                if callable(v) or isinstance(v, (classmethod, staticmethod)):
                    f = v.__func__ if isinstance(v, (classmethod, staticmethod)) else v
                    try:
                        members[m] = str(inspect.signature(f))
                    except (TypeError, ValueError):
                        pass
                elif isinstance(v, property):
                    members[m] = "property"
            sigs[name] = members
    out["signatures"] = sigs
    ctx = click.Context(cli)
    cmds = {}
    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        params = []
        for p in cmd.params:
            params.append(sorted(p.opts + p.secondary_opts) if isinstance(p, click.Option) else [f"<{p.name}>"])
        cmds[name] = sorted(params)
    out["commands"] = cmds
    return out


def test_the_public_api_is_what_it_was():
    now, pinned = surface(), json.loads(PINNED.read_text())
    assert now["exports"] == pinned["exports"]
    for name in pinned["signatures"]:
        assert now["signatures"][name] == pinned["signatures"][name], name
    for name in pinned["commands"]:
        assert now["commands"].get(name) == pinned["commands"][name], name
    assert now == pinned


def test_session_is_importable_from_its_old_module():
    from mlxspec.session import ContextFullError, Session

    assert Session is mlxspec.Session and ContextFullError is mlxspec.ContextFullError


def test_a_changed_flag_is_caught(monkeypatch):
    """The control: renaming one option of one command makes the surface differ."""
    pinned = json.loads(PINNED.read_text())
    cmd = cli.get_command(click.Context(cli), "generate")
    opt = next(p for p in cmd.params if isinstance(p, click.Option) and "--temp" in p.opts)
    monkeypatch.setattr(opt, "opts", ["--temperature"])
    assert surface()["commands"]["generate"] != pinned["commands"]["generate"]
