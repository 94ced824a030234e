"""Hybrid and state-space models through the real entry points: `mlxspec generate`
in a subprocess (plain decoding, a draft model, prompt lookup), a one-line
refusal for a cache that cannot be rolled back, and multi-turn Session reuse,
which still feeds only the new message (plus the few tokens of the last round a
rollback left to re-feed)."""

import json

import pytest

import mlxspec
import tiny_hybrid
import tiny_models
from cli_util import assert_refused, run_cli
from mlxspec.session.session import Session


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    return {
        "qwen3_5": tiny_hybrid.save(root / "qwen3_5", "qwen3_5", seed=0, layer_scale=0.5),
        "mamba2": tiny_hybrid.save(root / "mamba2", "mamba2", seed=1),
        "lfm2": tiny_hybrid.save(root / "lfm2", "lfm2", seed=3, family=None, layer_scale=3.0),
        "qwen2": tiny_hybrid.save(root / "qwen2", "qwen2", seed=2),
    }


def generate_json(cwd, *args):
    res = run_cli(cwd, "generate", "--json", "--ignore-chat-template", "-m", "20", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("arch", tiny_hybrid.HYBRIDS)
def test_plain_decoding_of_a_hybrid(arch, folders, tmp_path):
    out = generate_json(tmp_path, "--model", str(folders[arch]), "--no-draft", "-p", "the cat sat on")
    assert len(out["tokens"]) == 20 and out["stats"]["draft_proposed"] == 0


@pytest.mark.parametrize("target,extra", [
    ("qwen3_5", ["--draft", "qwen2"]),  # hybrid target, attention-only draft
    ("mamba2", ["--draft", "qwen3_5"]),  # state-space target, hybrid draft
    ("lfm2", ["--drafter", "lookup"]),
])
def test_speculative_generation_is_identical_to_plain(target, extra, folders, tmp_path):
    extra = [folders[e].as_posix() if e in folders else e for e in extra]
    prompt = "the cat sat on the mat and the cat sat on the mat and the cat"
    out = generate_json(tmp_path, "--model", str(folders[target]), *extra, "--num-draft", "4", "--compare",
                        "-p", prompt)
    assert out["plain"]["same_text"] and out["stats"]["draft_proposed"] > 0
    assert "refed_positions" in out["stats"]


def test_a_cache_that_cannot_roll_back_is_refused_in_one_line(tmp_path):
    cfg = dict(model_type="deepseek_v41", vocab_size=300, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, head_dim=16, q_lora_rank=16, qk_rope_head_dim=8, o_groups=1, o_lora_rank=16,
               moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, sliding_window=8,
               compress_ratios=[1, 1], index_n_heads=2, index_head_dim=8, index_topk=4, hc_mult=1)
    m = tiny_models.save_model_dir(tmp_path / "dsv4", "llama", model=tiny_models.build(cfg), cfg_overrides=cfg)
    res = run_cli(tmp_path, "generate", "--model", str(m), "--no-draft", "-p", "x")
    assert_refused(res, "cannot be rolled back exactly", "LayerCache")


def test_session_reuse_feeds_only_the_new_message(folders):
    pair = mlxspec.load(folders["qwen3_5"], folders["qwen2"])
    s = Session(pair, max_tokens=12, num_draft=3)
    first = s.stream("hello, this is the first message of a conversation")
    list(first)
    before = s.tokens
    target = s.decoder.target
    lag = len(before) - 1 - len(target.tokens)  # a rollback at the end left the last round's tokens to re-feed
    assert 0 <= lag <= 3 + 1 and target.tokens == before[: len(target.tokens)]
    second = s.stream("second message")
    list(second)
    prompt = second.prompt_tokens
    new = len(prompt) - len(before)
    assert prompt[: len(before)] == before and 0 < new < len(prompt) // 2
    assert second.prompt_tokens_processed == new + 1 + lag
    plain = Session(mlxspec.load(folders["qwen3_5"]), max_tokens=12, drafting=False)
    for text in ("hello, this is the first message of a conversation", "second message"):
        plain.send(text)
    assert plain.tokens == s.tokens
