"""Session settings are checked when given (issue 13): a bad value fails at
construction, before any model is loaded; `draft` names a draft model (as in
`mlxspec.load` and the CLI) while `drafting`/`drafter` say whether and how to
draft; and a turn interrupted before its first reply token leaves no trace."""

import warnings

import pytest

import mlxspec
from mlxspec.errors import MlxspecError
from mlxspec.session.session import Session


@pytest.mark.parametrize("kw,needle", [
    ({"max_tokens": 0}, "max_tokens must be a whole number >= 1, got 0"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"num_draft": 99}, "num_draft must be a whole number >= 0 and <= 16"),
    ({"num_draft": "four"}, "num_draft"),
    ({"p_min": 2.0}, "p_min must be a number >= 0 and <= 1"),
    ({"on_cancel": "forget"}, "on_cancel must be 'keep' or 'drop'"),
    ({"system": 5}, "system must be text"),
    ({"temp": -1}, "temp"),
    ({"top_p": 2}, "top_p"),
    ({"tmep": 0.5}, "unknown setting 'tmep'"),
    ({"drafting": "yes"}, "drafting must be True or False"),
])
def test_bad_settings_fail_at_construction_before_loading(kw, needle):
    # model= names nothing loadable: the setting is refused first, so nothing is loaded
    with pytest.raises(MlxspecError) as e:
        Session(model="/nonexistent/model", **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)  # callers catching ValueError keep working


def test_bad_settings_fail_at_construction_on_a_loaded_pair(tiny_pair):
    with pytest.raises(MlxspecError, match="max_tokens"):
        Session(tiny_pair, max_tokens=0)
    s = Session(tiny_pair, max_tokens=4)
    with pytest.raises(MlxspecError, match="max_tokens"):
        s.max_tokens = 0
    with pytest.raises(MlxspecError, match="num_draft"):
        s.num_draft = -1
    with pytest.raises(MlxspecError, match="unknown drafter"):
        Session(tiny_pair, drafter="magic")
    with pytest.raises(MlxspecError, match="give a loaded pair or model=/draft=, not both"):
        Session(tiny_pair, model="smollm2-135m")


def test_draft_names_a_model_and_drafting_switches(tiny_pair_dirs):
    target, draft = tiny_pair_dirs
    s = Session(model=str(target), draft=str(draft), max_tokens=6, num_draft=3)
    assert s.has_draft_model and s.drafting and s.drafter == "model"
    reply = s.send("hello")
    assert reply.stats.draft_proposed > 0
    s.drafting = False
    assert s.send("again").stats.draft_proposed == 0
    s = Session(model=str(target), drafter="lookup", max_tokens=2)  # a drafter without a draft model
    assert not s.has_draft_model and s.drafting and s.drafter == "lookup"


def test_the_old_meaning_of_draft_still_works_with_a_deprecation_warning(tiny_pair):
    with pytest.warns(DeprecationWarning, match="drafting"):
        s = Session(tiny_pair, draft=False)
    assert not s.drafting
    with pytest.warns(DeprecationWarning):
        s.draft = True
    assert s.drafting and s.draft


def test_without_a_draft_model_lookup_drafts_and_the_error_says_how(tiny_pair_dirs):
    target, _ = tiny_pair_dirs
    pair = mlxspec.load(target)
    s = Session(pair, max_tokens=4)
    assert not s.drafting and s.drafter == "none"
    with pytest.raises(MlxspecError, match="drafter='lookup'"):
        s.drafting = True
    s = Session(pair, max_tokens=4, drafter="lookup", num_draft=3)
    assert s.drafting and s.drafter == "lookup"
    assert s.send("one two three one two three one two").stats.drafter == "prompt-lookup"
    with pytest.raises(MlxspecError, match="needs a draft model"):
        Session(pair, drafter="model")


def test_a_turn_cancelled_before_its_first_token_leaves_no_trace(tiny_pair):
    s = Session(tiny_pair, max_tokens=6, num_draft=3)
    first = s.send("hello")
    messages, tokens = list(s.messages), s.tokens
    stream = s.stream("a long message that the user gave up on " * 20)
    s.cancel()  # before anything was processed: the prompt is stopped between chunks
    with stream:
        assert list(stream) == []
    assert stream.reply.cancelled and stream.reply.tokens == []
    assert s.messages == messages and s.tokens == tokens  # the message is not kept
    nxt = s.stream("and now?")
    assert nxt.prompt_tokens[:len(tokens)] == tokens
    assert "gave up" not in s.tokenizer.decode(nxt.prompt_tokens)
    with nxt:
        list(nxt)
    ref = mlxspec.generate(tiny_pair, nxt.prompt_tokens, max_tokens=6, drafter="none")
    assert nxt.tokens == ref.tokens and first.text


def test_a_reply_cancelled_after_tokens_is_kept(tiny_pair):
    s = Session(tiny_pair, max_tokens=40, num_draft=2)
    stream = s.stream("tell me")
    with stream:
        for _ in stream:
            s.cancel()
    assert stream.reply.cancelled and stream.reply.tokens
    assert [m["role"] for m in s.messages] == ["user", "assistant"]
    assert s.messages[1]["content"] == stream.reply.text


def test_no_deprecation_warning_from_the_new_names(tiny_pair):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = Session(tiny_pair, drafting=False, max_tokens=2)
        s.drafting = True


def test_a_pruned_draft_head_built_on_one_thread_drafts_on_another(tiny_pair):
    """The README's Session example: the pair is loaded (and the draft's pruned head
    built) on the main thread, replies run on a worker thread.  MLX streams are per
    thread, so a lazily built head crashed there with 'There is no Stream(cpu, 0)
    in current thread'."""
    import threading

    decoder = mlxspec.make_decoder(tiny_pair, "model", 3, draft_vocab=200)
    assert decoder.drafter.subset is not None
    got = {}

    def work():
        try:
            got["result"] = mlxspec.generate(tiny_pair, "hello", max_tokens=8, decoder=decoder)
        except BaseException as e:  # noqa: BLE001  (reported below)
            got["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in got, got.get("error")
    assert got["result"].stats.draft_proposed > 0
