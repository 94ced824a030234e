"""Bad option values (issue 13, items 1, 6 and 9): every one refused while the command line
is parsed -- before anything is loaded -- as one line with exit 2, in the same words the
Python API raises (core/options.py)."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import mlxspec
from mlxspec.core.options import RULES, BadValue, check

NOWHERE = "/nonexistent/model"  # loading it would fail with exit 1, "model not found"


def run_cli(*args, timeout=120):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "mlxspec.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def usage_error(r) -> str:
    """Exit 2, one `error:` line on stderr, nothing on stdout, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and not r.stdout.strip(), (r.stdout, r.stderr)
    return lines[0]


# (command line, the option the error names, the rule's name in options.RULES or None)
SAMPLING = [
    ("--temp", "-1", "temp"), ("--top-p", "2", "top_p"), ("--top-p", "0", "top_p"), ("--min-p", "2", "min_p"),
    ("--top-k", "-3", "top_k"), ("--top-k", "1.5", "top_k"), ("--repetition-penalty", "0", "repetition_penalty"),
    ("--temp", "nan", "temp"), ("--temp", "hot", "temp"), ("--seed", "-1", "seed"),
    ("-m", "-5", "max_tokens"), ("-m", "0", "max_tokens"), ("--num-draft", "20", "num_draft"),
    ("--num-draft", "-1", "num_draft"), ("--draft-p-min", "2", "p_min"),
]
CASES = (
    [(["generate", "--model", NOWHERE, "-p", "hi", opt, val], opt, rule) for opt, val, rule in SAMPLING]
    + [(["generate", "--model", NOWHERE, "-p", "hi", "--num-draft-max", "17"], "--num-draft-max", "num_draft_max"),
       (["generate", "--model", NOWHERE, "-p", "hi", "--draft-vocab", "-1"], "--draft-vocab", "draft_vocab"),
       (["generate", "--model", NOWHERE, "-p", "hi", "--compare", "--compare-repeats", "0"], "--compare-repeats",
        "repeats"),
       (["generate", "--model", NOWHERE, "-p", "", "--ignore-chat-template"], "--prompt", None),
       (["generate", "--model", NOWHERE, "-p", "hi", "--drafter", "magic"], "--drafter", None)]
    + [(["chat", "--model", NOWHERE, opt, val], opt, rule) for opt, val, rule in SAMPLING]
    + [(["bench", "--model", NOWHERE, "--temps", "0,-1"], "--temps", None),
       (["bench", "--model", NOWHERE, "--repeats", "0"], "--repeats", "repeats"),
       (["bench", "--model", NOWHERE, "--seed", "-1"], "--seed", "seed"),
       (["bench", "--model", NOWHERE, "-k", "20"], "--num-draft", None),
       (["bench", "--model", NOWHERE, "-m", "1"], "--max-tokens", None),
       (["bench", "--model", NOWHERE, "--quick", "--no-draft"], "--no-draft", None),
       (["pairs", "--context", "-5"], "--context", "context"),
       (["chat", "--model", NOWHERE, "--ignore-chat-template", "--system-prompt", "x"], "--system-prompt", None)]
    + [([cmd, "--model", NOWHERE, *extra, "--max-kv-size", v], "--max-kv-size", "max_kv_size")
       for cmd, extra in (("generate", ["-p", "hi"]), ("chat", []), ("serve", [])) for v in ("0", "-3", "20", "1.5")]
    + [(["pairs", "--budget", "0"], "--budget", "budget"),
       (["convert", "org/target", "--draft", "org/draft", "--context", "-5"], "--context", "context")]
)


def run_main(*args):
    """The `mlxspec` entry point (cli.main) in this process: its exit status, stdout and stderr
    (what a subprocess would give, in milliseconds instead of a second of start-up each)."""
    import contextlib
    import io

    from mlxspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("argv, option, rule", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_bad_value_is_a_one_line_usage_error_before_loading(argv, option, rule):
    line = usage_error(run_main(*argv))
    assert option in line, line  # the error names the option
    assert NOWHERE not in line and "not found" not in line  # nothing was loaded
    if rule is not None:  # the CLI's words are the API's: the rule of core/options.py
        assert RULES[rule].describe() in line, line


@pytest.mark.parametrize("case", [0, len(SAMPLING) + 5, len(CASES) - 1])
def test_the_same_in_a_real_process(case):
    """A few of the cases above as the command really runs (a process of its own): exit 2, one line."""
    argv, option, _ = CASES[case]
    assert option in usage_error(run_cli(*argv))


@pytest.mark.parametrize("name, value", [
    ("temp", -1.0), ("top_p", 2.0), ("top_p", 0), ("min_p", 2.0), ("top_k", -3), ("repetition_penalty", 0),
    ("seed", -1), ("temp", float("inf")), ("top_k", 1.5), ("top_k", True),
])
def test_sampling_params_raise_the_same_one_line_error(name, value):
    with pytest.raises(mlxspec.MlxspecError) as e:
        mlxspec.SamplingParams(**{name: value})
    assert isinstance(e.value, BadValue) and isinstance(e.value, ValueError)  # old `except ValueError` still works
    assert str(e.value) == f"{name} {RULES[name].describe()}, got {value!r}"
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, name", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -5}, "max_tokens"), ({"num_draft": 20}, "num_draft"),
    ({"num_draft": "many"}, "num_draft"), ({"num_draft_max": -1}, "num_draft_max"), ({"p_min": 2.0}, "p_min"),
    ({"draft_vocab": -1}, "draft_vocab"), ({"temp": -1}, "temp"), ({"top_p": 0}, "top_p"),
])
def test_api_refuses_bad_values_in_one_line(tiny_pair, kwargs, name):
    for call in (mlxspec.generate, mlxspec.stream_generate):
        with pytest.raises(mlxspec.MlxspecError) as e:
            call(tiny_pair, "hello", **kwargs)
        assert str(e.value).startswith(f"{name} {RULES[name].describe()}, got "), str(e.value)


@pytest.mark.parametrize("kwargs, name", [({"num_draft": 20}, "num_draft"), ({"p_min": -0.5}, "p_min"),
                                          ({"temp": -1}, "temp")])
def test_session_refuses_bad_values_when_made(tiny_pair, kwargs, name):
    from mlxspec.session.session import Session

    with pytest.raises(mlxspec.MlxspecError) as e:
        Session(tiny_pair, **kwargs)
    assert str(e.value).startswith(f"{name} {RULES[name].describe()}, got "), str(e.value)


def test_empty_raw_prompt_is_refused_in_one_line(tiny_pair):
    with pytest.raises(mlxspec.MlxspecError, match="the prompt is empty"):
        mlxspec.generate(tiny_pair, "", chat_template=False, max_tokens=4)


def test_rules_as_plain_functions():
    """For a server: check() without click."""
    assert check("temp", 0) == 0.0 and isinstance(check("temp", 1), float)
    assert check("num_draft", "auto") == "auto" and check("num_draft", 3) == 3 and check("seed", None) is None
    with pytest.raises(BadValue) as e:
        check("num_draft", 17)
    assert e.value.name == "num_draft" and e.value.value == 17


def test_chat_num_draft_help_says_auto_not_four():
    from mlxspec.commands.chat import chat

    out = CliRunner().invoke(chat, ["--help"]).output
    assert "(default 4)" not in out and "'auto' (the default)" in " ".join(out.split())


def test_import_mlxspec_is_light():
    """`import mlxspec` (and the CLI's start) loads no MLX: a Ctrl-C while the heavy libraries
    load lands inside the CLI's own handler."""
    r = subprocess.run([sys.executable, "-c", "import sys, mlxspec, mlxspec.cli; "
                        "print('mlx.core' in sys.modules, 'transformers' in sys.modules); "
                        "print(mlxspec.SamplingParams.__name__, mlxspec.api.encode_prompt.__name__)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "SamplingParams", "encode_prompt"]
