"""`chat` takes every drafting option `generate` takes (issue 61), and they reach the
Session's policy and drafter; `setup.sh` refuses a Python older than 3.10 in one line
that says how to get one (macOS's own python3 is 3.9)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import mlxspec
from mlxspec.commands.chat import chat
from mlxspec.commands.generate import generate
from mlxspec.costs.draft_length import PerToken

from cli_util import run_cli

ROOT = Path(__file__).resolve().parent.parent
NOT_DRAFTING = {"prompt", "show_prompt", "verbose", "compare", "compare_repeats", "as_json",  # generate's output
                "ignore_chat_template", "system", "max_tokens"}


def names(command) -> dict:
    return {p.name: sorted(p.opts + p.secondary_opts) for p in command.params}


def test_chat_takes_every_drafting_option_of_generate():
    gen, ch = names(generate), names(chat)
    missing = {n: o for n, o in gen.items() if n not in NOT_DRAFTING and gen[n] != ch.get(n)}
    assert not missing, f"generate options chat lacks (or spells differently): {missing}"
    for n in ("num_draft_max", "draft_vocab", "cost_profile", "drafter", "draft_p_min", "tree", "num_draft"):
        assert n in ch


def test_chat_checks_them_while_parsing(tmp_path):
    res = run_cli(tmp_path, "chat", "--model", "/nonexistent/model", "--num-draft-max", "-1", timeout=60)
    assert res.returncode == 2 and "--num-draft-max" in res.stderr and "No such option" not in res.stderr, res.stderr
    res = run_cli(tmp_path, "chat", "--model", "/nonexistent/model", "--cost-profile", "no-such-profile", timeout=60)
    assert res.returncode == 2 and "--cost-profile" in res.stderr and "No such option" not in res.stderr, res.stderr


def test_the_session_uses_them(tiny_pair):
    s = mlxspec.Session(tiny_pair, drafter="lookup", num_draft_max=3)
    policy = s.decoder.policy
    assert isinstance(policy, PerToken) and policy.max_k == 3
    with pytest.raises(ValueError, match="num_draft_max"):
        mlxspec.Session(tiny_pair, drafter="lookup", num_draft_max=-1)


def test_setup_refuses_an_old_python_in_one_line(tmp_path):
    shutil.copy(ROOT / "setup.sh", tmp_path / "setup.sh")
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\nif [ "$1" = "-V" ]; then echo "Python 3.9.6"; exit 0; fi\n'
                   'exec "$REAL_PY" -c "import sys; sys.exit(1)"\n')
    old.chmod(0o755)
    env = {**os.environ, "PYTHON": str(old), "REAL_PY": shutil.which("python3") or "python3"}
    res = subprocess.run(["bash", str(tmp_path / "setup.sh")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines  # refused before anything else ran
    assert "3.10" in lines[0] and "Python 3.9.6" in lines[0] and "PYTHON=" in lines[0], lines[0]
    assert not (tmp_path / ".venv").exists()
