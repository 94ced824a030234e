"""mlx-lm users' spellings and habits (issue: a newcomer's first hour, item 11):
--draft-model / --num-draft-tokens, --system-prompt, --show-prompt, --verbose/--quiet,
peak memory in the summary, piped chat input without prompts; and one default
draft length for the API and a bare SpeculativeDecoder (auto)."""

import json

from test_api_cli import run_cli


def test_mlx_lm_spellings_mean_the_same(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    outs = []
    for flags in (("--draft", str(d), "--num-draft", "2"), ("--draft-model", str(d), "--num-draft-tokens", "2")):
        r = run_cli("generate", "--model", str(t), *flags, "-p", "hello", "-m", "8", "--json")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    assert outs[0]["tokens"] == outs[1]["tokens"]
    assert outs[1]["stats"]["drafter"] == "draft-model" and set(outs[1]["stats"]["k_history"]) <= {0, 1, 2}


def test_system_prompt_show_prompt_and_quiet(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    r = run_cli("generate", "--model", str(t), "--draft", str(d), "-p", "hello", "-m", "4",
                "--system-prompt", "You are terse.", "--show-prompt")
    assert r.returncode == 0, r.stderr
    assert "You are terse." in r.stderr and "hello" in r.stderr  # the rendered prompt, template applied
    assert "peak memory" in r.stderr
    q = run_cli("generate", "--model", str(t), "--draft", str(d), "-p", "hello", "-m", "4", "--quiet")
    assert q.returncode == 0 and q.stderr.strip() == "" and q.stdout.strip(), (q.stdout, q.stderr)
    bad = run_cli("generate", "--model", str(t), "-p", "hello", "--ignore-chat-template", "--system-prompt", "x")
    assert bad.returncode == 2 and "--system-prompt" in bad.stderr and "Traceback" not in bad.stderr


def test_piped_chat_prints_no_prompts(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    r = run_cli("chat", "--model", str(t), "--draft", str(d), "--max-tokens", "4", input="hello\n/quit\n")
    assert r.returncode == 0, r.stderr
    assert ">>>" not in r.stdout


def test_a_bare_decoder_drafts_with_auto_as_the_api_does(tiny_pair):
    from mlxspec.costs.draft_length import PerToken
    from mlxspec.drafting.drafters import ModelDrafter
    from mlxspec.decoder import SpeculativeDecoder

    dec = SpeculativeDecoder(tiny_pair.target, ModelDrafter(tiny_pair.draft))
    assert isinstance(dec.policy, PerToken)
    assert isinstance(mlxspec_default_policy(tiny_pair), PerToken)


def mlxspec_default_policy(pair):
    from mlxspec import api

    return api.make_decoder(pair).policy
