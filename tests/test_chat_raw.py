"""`chat --ignore-chat-template` / `Session(chat_template=False)`: no template; each
message's raw text continues the conversation, so the model reads exactly the
concatenated texts (the replies as generated), a later turn processes only its new
text, the system prompt is refused in generate's words, the mode survives save/load,
and a model without a chat template is pointed at the flag."""

import json
import shutil

import pytest

import mlxspec
from mlxspec.api import encode_prompt
from mlxspec.session.session import Session
from mlxspec.session.settings import NO_TEMPLATE_SYSTEM
from test_api_cli import run_cli


def raw_ids(tok, text):
    return list(tok.encode(text, add_special_tokens=False))


def plain_greedy(pair, ids, n):
    return mlxspec.generate(pair, list(ids), max_tokens=n, drafter="none").tokens


def test_session_feeds_the_concatenated_raw_texts(tiny_pair):
    tok = tiny_pair.tokenizer
    s = Session(tiny_pair, chat_template=False, max_tokens=6, num_draft=2)
    first = s.send("Once upon")
    prompt1 = encode_prompt(tok, "Once upon", chat_template=False)  # as generate --ignore-chat-template
    assert s.tokens == prompt1 + first.tokens
    assert first.tokens == plain_greedy(tiny_pair, prompt1, 6)
    stream = s.stream(" and then")
    for _ in stream:
        pass
    history = prompt1 + first.tokens + raw_ids(tok, " and then")
    assert stream.prompt_tokens == history
    assert stream.prompt_tokens_processed == len(raw_ids(tok, " and then")) + 1  # only the new text (+ the last token)
    assert s.tokens == history + stream.reply.tokens
    assert stream.reply.tokens == plain_greedy(tiny_pair, history, 6)
    assert s._token_text == "Once upon" + first.text + " and then" + stream.reply.text
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]


def test_a_raw_session_refuses_a_system_prompt(tiny_pair):
    with pytest.raises(mlxspec.MlxspecError) as e:
        Session(tiny_pair, chat_template=False, system="You are terse.")
    assert str(e.value) == NO_TEMPLATE_SYSTEM == "system needs the chat template (drop chat_template=False)"
    s = Session(tiny_pair, chat_template=False)
    with pytest.raises(mlxspec.MlxspecError, match="needs the chat template"):
        s.system = "You are terse."
    s.system = None  # clearing is fine
    with pytest.raises(mlxspec.MlxspecError, match="chat_template must be True or False"):
        Session(tiny_pair, chat_template="no")
    with pytest.raises(mlxspec.MlxspecError, match="the prompt is empty"):
        s.send("")


def test_the_mode_and_max_kv_size_survive_save_and_load(tiny_pair, tmp_path):
    s = Session(tiny_pair, chat_template=False, max_kv_size=32, max_tokens=4, num_draft=2)
    s.send("Once upon")
    path = s.save(tmp_path / "raw.json")
    settings = json.loads(path.read_text())["settings"]
    assert settings["chat_template"] is False and settings["max_kv_size"] == 32
    back = Session.load(path, tiny_pair)
    assert back.chat_template is False and back.max_kv_size == 32 and back.tokens == s.tokens
    stream = back.stream(" and then")
    list(stream)
    assert stream.prompt_tokens == s.tokens + raw_ids(tiny_pair.tokenizer, " and then")
    data = json.loads(path.read_text())
    data["settings"]["max_kv_size"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(mlxspec.MlxspecError, match="field 'settings.max_kv_size' must be a whole number >= 21"):
        Session.load(path, tiny_pair)


class BosTokenizer:
    """A tokenizer that adds BOS (id 1) to a text, as Llama's do."""

    bos_token, bos_token_id = "<s>", 1

    def encode(self, text, add_special_tokens=True):
        ids = [10 + ord(c) % 50 for c in text.removeprefix("<s>")]
        return ([1] if add_special_tokens or text.startswith("<s>") else []) + ids


def test_the_first_raw_message_gets_bos_where_generate_would():
    from mlxspec.session import prompt as session_prompt

    text, ids = session_prompt.raw(BosTokenizer(), "hi", [], "")
    assert ids[0] == 1 and text == "<s>hi"  # the text spells what the ids hold (session files check that)
    text, ids = session_prompt.raw(BosTokenizer(), "<s>hi", [], "")
    assert ids.count(1) == 1 and text == "<s>hi"
    text, ids = session_prompt.raw(BosTokenizer(), " more", [1, 5], "<s>x")
    assert ids[:2] == [1, 5] and 1 not in ids[2:] and text == "<s>x more"


def test_piped_chat_with_ignore_chat_template(tiny_pair_dirs, tiny_pair, tmp_path):
    t, d = tiny_pair_dirs
    saved = tmp_path / "chat.json"
    r = run_cli("chat", "--model", str(t), "--draft", str(d), "--max-tokens", "6", "--num-draft", "2",
                "--ignore-chat-template", "--max-kv-size", "32",
                input=f"Once upon\n and then\n/save {saved}\n/quit\n")
    assert r.returncode == 0, r.stderr
    assert "each message is fed as raw text" in r.stdout
    summaries = [ln for ln in r.stdout.splitlines() if "tok processed" in ln]
    assert len(summaries) == 2, r.stdout
    tok = tiny_pair.tokenizer
    new = len(raw_ids(tok, " and then"))
    assert f"prompt {new + 1}/" in summaries[1], summaries[1]  # the second turn processed only its text
    data = json.loads(saved.read_text())
    assert data["settings"]["chat_template"] is False and data["settings"]["max_kv_size"] == 32
    replies = [m["content"] for m in data["messages"] if m["role"] == "assistant"]
    assert data["token_text"] == "Once upon" + replies[0] + " and then" + replies[1]
    tokens, prompt1 = data["tokens"], encode_prompt(tok, "Once upon", chat_template=False)
    assert tokens[: len(prompt1)] == prompt1
    n1 = int(summaries[0].lstrip("[").split()[0])
    assert tokens[len(prompt1) + n1: len(prompt1) + n1 + new] == raw_ids(tok, " and then")


def test_chat_refuses_system_prompt_with_ignore_chat_template_before_loading():
    r = run_cli("chat", "--model", "/nonexistent/model", "--ignore-chat-template", "--system-prompt", "x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: Invalid value for '--system-prompt': needs the chat template (drop --ignore-chat-template) "
        "(see `mlxspec chat --help`)"]


def test_a_model_without_a_template_points_at_the_flag(tiny_pair_dirs, tmp_path):
    t, d = tiny_pair_dirs
    bare = tmp_path / "bare"
    shutil.copytree(t, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = run_cli("chat", "--model", str(bare), "--no-draft", "--max-tokens", "3", input="hello\n/quit\n")
    assert r.returncode == 0, r.stderr
    assert "plain 'User:/Assistant:' transcript (--ignore-chat-template feeds your messages as raw text" in r.stdout
    r = run_cli("chat", "--model", str(bare), "--no-draft", "--max-tokens", "3", "--ignore-chat-template",
                input="hello\n/system be terse\n/quit\n")
    assert r.returncode == 0, r.stderr
    assert "transcript" not in r.stdout and "/system needs the chat template" in r.stdout
