"""Session.load on files that were edited, tampered with or are not session files
at all: one MlxspecError naming the field, never a raw ValueError/KeyError/TypeError,
never a silently accepted token history that the messages do not match."""

import json

import pytest

from mlxspec.errors import MlxspecError
from mlxspec.session.session import Session


@pytest.fixture(scope="module")
def saved(tiny_pair, tmp_path_factory):
    """(pair, the saved JSON as a dict, the session it came from)."""
    s = Session(tiny_pair, max_tokens=6, system="be brief", temp=0.5, seed=1, num_draft=3)
    s.send("hello there")
    s.send("and again")
    path = s.save(tmp_path_factory.mktemp("saved") / "conv.json")
    return tiny_pair, json.loads(path.read_text()), s


def _set(path, value):
    def mutate(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return mutate


def _delete(path):
    def mutate(d):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return mutate


def _one_token(value, i=5):
    def mutate(d):
        assert d["tokens"][i] != value
        d["tokens"][i] = value
    return mutate


# (id, mutation of the saved dict, the field the error must name, words it must contain)
CASES = [
    ("token-replaced-by-1", _one_token(1), "tokens", "does not spell field 'token_text'"),
    ("all-tokens-1", lambda d: d.update(tokens=[1] * len(d["tokens"])), "tokens", "does not spell"),
    ("token-dropped", lambda d: d["tokens"].pop(3), "tokens", "does not spell"),
    ("token-float", _one_token(1.5), "tokens[5]", "must be an integer token id, got number 1.5"),
    ("token-whole-float", lambda d: d["tokens"].__setitem__(0, float(d["tokens"][0])), "tokens[0]",
     "must be an integer token id, got number"),
    ("token-bool", _one_token(True), "tokens[5]", "must be an integer token id, got boolean true"),
    ("token-string", _one_token("5"), "tokens[5]", "must be an integer token id, got string \"5\""),
    ("token-null", _one_token(None), "tokens[5]", "must be an integer token id, got null"),
    ("token-past-vocab", _one_token(5000), "tokens[5]", "holds token id 5000, out of range for this model's vocabulary (0..299)"),
    ("token-huge", _one_token(4_000_000), "tokens[5]", "out of range"),
    ("token-negative", _one_token(-1), "tokens[5]", "never negative"),
    ("tokens-string", _set(["tokens"], "1 2 3"), "tokens", "must be a list of token ids"),
    ("tokens-object", _set(["tokens"], {"0": 1}), "tokens", "must be a list of token ids"),
    ("token_text-number", _set(["token_text"], 5), "token_text", "must be a string"),
    ("token_text-missing", _delete(["token_text"]), "token_text", "is missing"),
    ("token_text-edited", lambda d: d.update(token_text=d["token_text"] + "extra"), "tokens", "does not spell"),
    ("format-missing", _delete(["format"]), "format", "is missing"),
    ("format-other", _set(["format"], "something.else"), "format", "not an mlxspec session file"),
    ("version-missing", _delete(["version"]), "version", "is missing"),
    ("version-string", _set(["version"], "1"), "version", "must be an integer"),
    ("version-bool", _set(["version"], True), "version", "must be an integer"),
    ("version-newer", _set(["version"], 99), "version", "newer mlxspec"),
    ("version-zero", _set(["version"], 0), "version", "at least 1"),
    ("saved_at-number", _set(["saved_at"], 12), "saved_at", "must be a string"),
    ("model-missing", _delete(["model"]), "model", "is missing"),
    ("model-number", _set(["model"], 3), "model", "must be a string"),
    ("model-empty", _set(["model"], ""), "model", "is empty"),
    ("draft_model-list", _set(["draft_model"], ["a"]), "draft_model", "must be a string or null"),
    ("system-number", _set(["system"], 7), "system", "must be a string or null"),
    ("system-mismatch", _set(["system"], "other"), "messages[0].content", "differs from field 'system'"),
    ("messages-missing", _delete(["messages"]), "messages", "is missing"),
    ("messages-object", _set(["messages"], {"role": "user"}), "messages", "must be a list"),
    ("message-string", _set(["messages", 1], "hi"), "messages[1]", "must be an object"),
    ("message-no-role", _delete(["messages", 1, "role"]), "messages[1].role", "is missing"),
    ("message-no-content", _delete(["messages", 2, "content"]), "messages[2].content", "is missing"),
    ("message-role-unknown", _set(["messages", 1, "role"], "robot"), "messages[1].role", "must be \"system\", \"user\" or \"assistant\""),
    ("message-role-number", _set(["messages", 1, "role"], 1), "messages[1].role", "must be a string"),
    ("message-content-number", _set(["messages", 2, "content"], 42), "messages[2].content", "must be a string"),
    ("message-content-null", _set(["messages", 2, "content"], None), "messages[2].content", "must be a string"),
    ("late-system-message", _set(["messages", 3, "role"], "system"), "messages[3].role", "only the first message"),
    ("settings-list", _set(["settings"], []), "settings", "must be an object"),
    ("max_tokens-string", _set(["settings", "max_tokens"], "512"), "settings.max_tokens", "must be a whole number >= 1, got string"),
    ("max_tokens-float", _set(["settings", "max_tokens"], 1.5), "settings.max_tokens", "must be a whole number >= 1, got number 1.5"),
    ("max_tokens-zero", _set(["settings", "max_tokens"], 0), "settings.max_tokens", "must be a whole number >= 1, got integer 0"),
    ("draft-string", _set(["settings", "draft"], "yes"), "settings.draft", "must be true or false"),
    ("num_draft-word", _set(["settings", "num_draft"], "many"), "settings.num_draft", "or 'auto' (0 = plain decoding), or null, got string"),
    ("num_draft-negative", _set(["settings", "num_draft"], -1), "settings.num_draft", ">= 0 and <= 16"),
    ("num_draft-float", _set(["settings", "num_draft"], 2.5), "settings.num_draft", "must be a whole number"),
    ("p_min-string", _set(["settings", "p_min"], "low"), "settings.p_min", "must be a number >= 0 and <= 1, got string"),
    ("p_min-too-big", _set(["settings", "p_min"], 2.0), "settings.p_min", "must be a number >= 0 and <= 1, got number 2"),
    ("on_cancel-other", _set(["settings", "on_cancel"], "explode"), "settings.on_cancel", "\"keep\" or \"drop\""),
    ("sampling-string", _set(["settings", "sampling"], "hot"), "settings.sampling", "must be an object"),
    ("sampling-unknown-key", _set(["settings", "sampling", "warmth"], 1), "settings.sampling.warmth", "not a sampling setting"),
    ("temp-string", _set(["settings", "sampling", "temp"], "hot"), "settings.sampling.temp", "must be a number >= 0 (0 = greedy), got string"),
    ("temp-nan", _set(["settings", "sampling", "temp"], float("nan")), "settings.sampling.temp", "must be a number >= 0"),
    ("temp-negative", _set(["settings", "sampling", "temp"], -1), "settings.sampling.temp", "must be a number >= 0 (0 = greedy), got integer -1"),
    ("top_k-float", _set(["settings", "sampling", "top_k"], 1.5), "settings.sampling.top_k", "must be a whole number >= 0"),
    ("top_p-zero", _set(["settings", "sampling", "top_p"], 0), "settings.sampling.top_p", "must be a number > 0 and <= 1 (1 = off), got integer 0"),
    ("seed-string", _set(["settings", "sampling", "seed"], "x"), "settings.sampling.seed", ", or null, got string"),
    ("stats-string", _set(["stats"], "fast"), "stats", "must be an object"),
]


@pytest.mark.parametrize("mutate, field, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tampered_field_is_refused_naming_it(saved, tmp_path, mutate, field, words):
    pair, data, _ = saved
    data = json.loads(json.dumps(data))  # a copy
    mutate(data)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MlxspecError) as e:
        Session.load(path, pair)
    msg = str(e.value)
    assert msg.startswith(f"session file {path}: field '{field}' "), msg
    assert words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("content, words", [
    (b"{not json", "is not JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    (b"", "is not JSON"),
    (b"[1, 2, 3]", "holds a JSON list, not a session"),
    (b"\"mlxspec.session.session\"", "holds a JSON string, not a session"),
    (b"null", "holds a JSON null, not a session"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
], ids=["not-json", "empty", "json-list", "json-string", "json-null", "not-utf8"])
def test_not_a_session_file(tiny_pair, tmp_path, content, words):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(MlxspecError) as e:
        Session.load(path, tiny_pair)
    assert str(e.value).startswith(f"session file {path} ") and words in str(e.value), str(e.value)


def test_missing_file(tiny_pair, tmp_path):
    with pytest.raises(MlxspecError, match="cannot read the session file .*No such file"):
        Session.load(tmp_path / "absent.json", tiny_pair)


def test_valid_round_trip_and_minimal_file(saved, tmp_path):
    pair, data, s = saved
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(data))
    back = Session.load(path, pair)
    assert back.conversation() == s.conversation() and back.tokens == s.tokens
    assert back.params == s.params and back.num_draft == 3 and back.max_tokens == 6
    # the token history is reused as the start of the next prompt
    nxt = back.stream("third")
    list(nxt)
    assert nxt.prompt_tokens[:len(s.tokens)] == s.tokens
    # a hand-written file with only the required fields
    minimal = {"format": "mlxspec.session.session", "version": 1, "model": data["model"],
               "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path.write_text(json.dumps(minimal))
    m = Session.load(path, pair)
    assert m.messages == minimal["messages"] and m.tokens == [] and m.system is None
    assert m.send("more").tokens


def test_edited_messages_are_tokenized_afresh(saved, tmp_path):
    """An edited message with the old (self-consistent) token history is accepted,
    but that history no longer matches what the template renders, so the next
    turn tokenizes the conversation afresh rather than trust it."""
    pair, data, s = saved
    data = json.loads(json.dumps(data))
    data["messages"][2]["content"] = "something the model never said"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    back = Session.load(path, pair)
    assert back.tokens == s.tokens
    text = back.render(back.conversation() + [{"role": "user", "content": "third"}])
    nxt = back.stream("third")
    list(nxt)
    assert nxt.prompt_tokens == pair.tokenizer.encode(text, add_special_tokens=False)
    assert nxt.prompt_tokens[:len(s.tokens)] != s.tokens


@pytest.mark.real
def test_smollm2_sessions_round_trip_and_tampering_is_caught(tmp_path):
    """A real tokenizer (GPT-2 style BPE, multi-byte text, a reply cut short): what
    save() writes loads back; one swapped token does not."""
    import mlxspec
    from mlxspec.models.pinned import fetch as weights

    if not weights.is_present("smollm2-135m"):
        pytest.skip("SmolLM2-135M is not in the cache (mlxspec pull smollm2)")
    pair = mlxspec.load("smollm2-135m")
    s = Session(pair, max_tokens=16, system="You are terse.", temp=0.9, seed=4)
    s.send("Write a haiku about caches, with an emoji 🚀.")
    with s.stream("Now in French, with accents: é, è, ç.") as st:  # interrupted after three chunks
        for _ in range(3):
            next(st)
    s.send("日本語で一言どうぞ")
    path = s.save(tmp_path / "smol.json")
    back = Session.load(path, pair)
    assert back.tokens == s.tokens and back.conversation() == s.conversation()
    data = json.loads(path.read_text())
    i = len(data["tokens"]) - 3
    data["tokens"][i] = 1 if data["tokens"][i] != 1 else 2
    path.write_text(json.dumps(data))
    with pytest.raises(MlxspecError, match="field 'tokens' does not spell field 'token_text'"):
        Session.load(path, pair)
