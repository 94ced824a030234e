"""The Python API, the `mlxspec generate` CLI and its one-line errors, on tiny models."""

import json
import os
import subprocess
import sys

import pytest

import mlxspec
import tiny_models
from mlxspec.models.tokenizer_compat import check_tokenizers

CLI = [sys.executable, "-m", "mlxspec.cli"]


def run_cli(*args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=300, env=env, **kw)


def test_generate_and_stream_agree(tiny_pair):
    res = mlxspec.generate(tiny_pair, "hello there", max_tokens=30)
    stream = mlxspec.stream_generate(tiny_pair, "hello there", max_tokens=30)
    chunks = list(stream)
    assert "".join(c.text for c in chunks) == res.text == stream.text
    assert [c.token for c in chunks if c.token >= 0] == res.tokens == stream.tokens
    s = stream.stats
    assert s.generated_tokens == len(res.tokens) and s.target_passes > 0
    assert sum(c.from_draft for c in chunks) == s.draft_accepted
    assert s.draft_accepted <= s.draft_proposed and 0 <= s.acceptance_rate <= 1
    assert s.tokens_per_pass == pytest.approx((s.generated_tokens + (s.finish_reason == "stop")) / s.target_passes)
    assert s.tokens_per_pass >= 1
    assert s.draft_time > 0 and s.verify_time > 0 and s.generation_tps > 0


def test_an_interrupt_before_the_stream_records_a_token_loses_nothing(tiny_pair, monkeypatch):
    """Ctrl-C can land after the decoder handed out a token and before the stream
    recorded it (CI once saw `generate --json` report 817 tokens generated with 816
    listed): after close(), the tokens, the text and the stats agree with the full
    generation's first tokens."""
    full = mlxspec.generate(tiny_pair, "hello there", max_tokens=30)
    stream = mlxspec.stream_generate(tiny_pair, "hello there", max_tokens=30)
    kind = type(tiny_pair.tokenizer.detokenizer)
    add, seen = kind.add_token, []

    def interrupted(detok, token):
        seen.append(token)
        if len(seen) == 7:
            raise KeyboardInterrupt
        add(detok, token)

    monkeypatch.setattr(kind, "add_token", interrupted)
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    stream.close()
    assert stream.stats.generated_tokens == len(stream.tokens) == 7
    assert stream.tokens == full.tokens[:7]
    assert stream.text == tiny_pair.tokenizer.decode(full.tokens[:7])


def test_plain_path_is_the_same_loop_and_gives_the_same_greedy_tokens(tiny_pair):
    spec = mlxspec.generate(tiny_pair, "abc def", max_tokens=30)
    plain = mlxspec.generate(tiny_pair, "abc def", max_tokens=30, drafter="none")
    assert plain.tokens == spec.tokens
    assert plain.stats.draft_proposed == 0 and plain.stats.target_passes == len(plain.tokens)


def test_chat_messages_use_the_template(tiny_pair):
    msgs = [{"role": "user", "content": "hi"}]
    ids = mlxspec.api.encode_prompt(tiny_pair.tokenizer, msgs)
    assert ids[0] == 3  # <|im_start|>
    res = mlxspec.generate(tiny_pair, msgs, max_tokens=8)
    assert res.stats.prompt_tokens == len(ids)


@pytest.mark.parametrize("num_draft", [4, None], ids=["k=4", "auto"])
def test_same_seed_same_output(tiny_pair, num_draft):
    """With a fixed k, and with the adaptive default: a seeded sampling run chooses k
    from a fixed cost model instead of wall-clock timings (a different k would consume
    the random stream differently)."""
    runs = [mlxspec.generate(tiny_pair, "seed test", max_tokens=40, temp=1.0, seed=s, num_draft=num_draft)
            for s in (7, 7, 8)]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].stats.k_history == runs[1].stats.k_history
    assert runs[0].tokens != runs[2].tokens


def test_cli_json(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    r = run_cli("generate", "--model", str(t), "--draft", str(d), "--prompt", "hello", "--max-tokens", "12",
                "--num-draft", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert isinstance(out["text"], str) and len(out["tokens"]) == out["stats"]["generated_tokens"] > 0
    for key in ("draft_proposed", "draft_accepted", "acceptance_rate", "tokens_per_pass", "acceptance_by_position",
                "target_passes", "draft_time", "verify_time", "prompt_tps", "generation_tps"):
        assert isinstance(out["stats"][key], (int, float, list)), key
    assert max(out["stats"]["k_history"]) == 3


def test_cli_stream_summary_and_no_draft(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    r = run_cli("generate", "--model", str(t), "--draft", str(d), "-p", "hello", "-m", "10", "--num-draft", "3")
    assert r.returncode == 0, r.stderr
    assert "acceptance" in r.stderr and "tok/s" in r.stderr
    # by default (auto): this tiny draft costs about as much as its target, so whether it drafts depends
    # on this machine's calibration; either way the summary says what happened (the rule itself is
    # tested on fixed costs in test_draft_length.py)
    r = run_cli("generate", "--model", str(t), "--draft", str(d), "-p", "hello", "-m", "10")
    assert r.returncode == 0, r.stderr
    assert "acceptance" in r.stderr or "fell back to plain decoding: 10 plain / 0 speculative tokens" in r.stderr
    r2 = run_cli("generate", "--model", str(t), "--no-draft", "-p", "hello", "-m", "10", "--json")
    out = json.loads(r2.stdout)
    assert out["stats"]["draft_proposed"] == 0 and out["stats"]["drafter"] == "none"


def one_line_error(r):
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_incompatible_pair_is_refused_naming_the_token(tmp_path, tiny_pair_dirs):
    t, _ = tiny_pair_dirs
    bad = tiny_models.save_model_dir(tmp_path / "bad", "qwen2", rename={42: "zz"})
    line = one_line_error(run_cli("generate", "--model", str(t), "--draft", str(bad), "-p", "x"))
    assert "token 42 differs" in line


def test_prompt_longer_than_context(tmp_path):
    short = tiny_models.save_model_dir(tmp_path / "short", "llama", max_pos=16)
    line = one_line_error(run_cli("generate", "--model", str(short), "--no-draft", "-p", "a " * 40,
                                  "--ignore-chat-template"))
    assert "context" in line


def test_truncated_weights(tmp_path):
    m = tiny_models.save_model_dir(tmp_path / "m", "llama")
    w = m / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    line = one_line_error(run_cli("generate", "--model", str(m), "-p", "x"))
    assert "corrupt or truncated" in line and str(m) in line


def test_missing_model():
    line = one_line_error(run_cli("generate", "--model", "/nonexistent/model", "-p", "x"))
    assert "/nonexistent/model: no such file or folder" in line  # not "model not found" / "not in the HF cache"


def test_ssm_model_speculates_exactly(tmp_path):
    """A state-space model rolls back through state checkpoints (core/recurrent.py); a cache
    that cannot roll back is refused in one line (tests/test_hybrid_cli.py)."""
    cfg = {"model_type": "mamba", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
           "state_size": 4, "num_hidden_layers": 1, "conv_kernel": 4, "use_bias": False,
           "use_conv_bias": True, "time_step_rank": 4, "tie_word_embeddings": True}
    model = tiny_models.build(cfg)
    m = tiny_models.save_model_dir(tmp_path / "mamba", "llama", model=model, cfg_overrides=cfg)
    res = run_cli("generate", "--model", str(m), "--draft", str(m), "-p", "x", "-m", "12", "--num-draft", "3",
                  "--compare", "--json", "--ignore-chat-template")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["plain"]["same_text"] and out["stats"]["draft_accepted"] > 0


def test_padding_tolerated_other_rules_enforced():
    base = tiny_models.make_tokenizer(300)
    assert check_tokenizers(base, tiny_models.make_tokenizer(300), 300, 428).ok  # padded embeddings
    assert not check_tokenizers(base, tiny_models.make_tokenizer(300), 300, 200).ok  # too few rows
    r = check_tokenizers(base, tiny_models.make_tokenizer(300, rename={17: "zz"}))
    assert not r.ok and "token 17" in r.reason
    r = check_tokenizers(base, tiny_models.make_tokenizer(300, eos="<|im_end|>"))
    assert not r.ok and "EOS" in r.reason


# -- untrusted token ids ----------------------------------------------------------

# Runs in a child process: an id past the embedding table used to kill the process
# (SIGSEGV, rc 139) rather than raise, and a negative one raised std::bad_cast.
BAD_IDS_SCRIPT = r"""
import json, sys
import mlxspec
from mlxspec.decoder import SpeculativeDecoder

pair = mlxspec.load(*sys.argv[2:])
def attempt(label, run):
    try:
        run()
        print(label, "OK", flush=True)
    except Exception as e:
        print(label, type(e).__name__, str(e).replace("\n", " | "), flush=True)
for ids in json.loads(sys.argv[1]):
    attempt("generate", lambda: mlxspec.generate(pair, ids, max_tokens=2))
    attempt("stream", lambda: list(mlxspec.stream_generate(pair, ids, max_tokens=2, drafter="none")))
    attempt("decoder", lambda: list(mlxspec.make_decoder(pair).generate(list(ids), max_tokens=2)))
    attempt("bare-decoder", lambda: list(SpeculativeDecoder(pair.target).generate(list(ids), max_tokens=2)))
print("survived", flush=True)
"""


def run_bad_ids(id_lists, *models):
    r = subprocess.run([sys.executable, "-c", BAD_IDS_SCRIPT, json.dumps(id_lists), *map(str, models)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0 and r.stdout.rstrip().endswith("survived"), (r.returncode, r.stdout, r.stderr[-2000:])
    lines = r.stdout.splitlines()[:-1]
    assert len(lines) == 4 * len(id_lists)
    return [lines[i:i + 4] for i in range(0, len(lines), 4)]


def assert_refused(results, message):
    for line in results:
        assert line.split(" ", 2)[1:] == ["MlxspecError", message], line


def test_out_of_range_token_ids_are_refused_not_a_crash(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    cases = [[5, 5000], [-1], [4_000_000], [5, 6, 300], [5, 299]]
    res = run_bad_ids(cases, t, d)
    assert_refused(res[0], "prompt: token id 5000 at position 1 is out of range for this model's vocabulary (0..299)")
    assert_refused(res[1], "prompt: token id -1 at position 0 is out of range for this model's vocabulary (0..299)")
    assert_refused(res[2], "prompt: token id 4000000 at position 0 is out of range for this model's vocabulary (0..299)")
    assert_refused(res[3], "prompt: token id 300 at position 2 is out of range for this model's vocabulary (0..299)")
    assert all(line.endswith(" OK") for line in res[4])  # the last row is fine


def test_padded_vocabularies_take_the_smaller_table(tmp_path):
    """models/tokenizer_compat.py allows embedding tables padded past the tokenizer: an id must have
    a row in the target AND the draft (here the draft has 428 rows, the target 300,
    and the other way round)."""
    small = tiny_models.save_model_dir(tmp_path / "small", "qwen2", vocab_size=300)
    padded = tiny_models.save_model_dir(tmp_path / "padded", "qwen2", vocab_size=428, tokenizer_vocab=300)
    message = "prompt: token id 350 at position 1 is out of range for this model's vocabulary (0..299)"
    # the draft, past its table, would crash the process (a bare decoder on the
    # padded target alone, with no draft, may use the id)
    res = run_bad_ids([[5, 350]], padded, small)[0]
    assert_refused(res[:3], message)
    assert res[3] == "bare-decoder OK"
    for models in ((small, padded), (padded, small)):
        pair = mlxspec.load(*models)
        assert pair.vocab_size == 300
        with pytest.raises(mlxspec.MlxspecError) as e:
            mlxspec.generate(pair, [5, 350], max_tokens=2)
        assert str(e.value) == message
    assert mlxspec.load(padded, no_draft=True).vocab_size == 428


@pytest.mark.parametrize("ids, message", [
    ([5, 1.5], "prompt: the token id at position 1 must be an integer, got float 1.5"),
    ([5, 6.0], "prompt: the token id at position 1 must be an integer, got float 6.0"),
    ([True, 5], "prompt: the token id at position 0 must be an integer, got bool True"),
    ([5, "7"], "prompt: the token id at position 1 must be an integer, got str '7'"),
], ids=["float", "whole-float", "bool", "str"])
def test_token_ids_must_be_ints(tiny_pair, ids, message):
    for run in (lambda: mlxspec.generate(tiny_pair, ids, max_tokens=2),
                lambda: mlxspec.stream_generate(tiny_pair, ids, max_tokens=2)):
        with pytest.raises(mlxspec.MlxspecError) as e:
            run()
        assert str(e.value) == message


@pytest.mark.real
def test_out_of_range_token_ids_on_smollm2():
    from mlxspec.models.pinned import fetch as weights

    if not weights.is_present("smollm2-135m"):
        pytest.skip("SmolLM2-135M is not in the cache (mlxspec pull smollm2)")
    res = run_bad_ids([[1, 4_000_000], [-1, 1], [1, 49152], [1, 49151]], "smollm2-135m")
    assert_refused(res[0], "prompt: token id 4000000 at position 1 is out of range for this model's vocabulary (0..49151)")
    assert_refused(res[1], "prompt: token id -1 at position 0 is out of range for this model's vocabulary (0..49151)")
    assert_refused(res[2], "prompt: token id 49152 at position 1 is out of range for this model's vocabulary (0..49151)")
    assert all(line.endswith(" OK") for line in res[3])
