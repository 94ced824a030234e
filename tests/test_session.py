"""The Session API for apps: multi-turn cache reuse, cancellation from another
thread, one generation at a time, callbacks, draft toggling, context limits, save/load."""

import json
import threading

import pytest

import mlxspec
from mlxspec.errors import MlxspecError
from mlxspec.session.session import ContextFullError, Session


def consume(stream):
    return [c for c in stream]


def test_second_turn_processes_only_the_new_tokens(tiny_pair):
    s = Session(tiny_pair, max_tokens=12, num_draft=3)
    first = s.stream("hello, this is the first message of a conversation")
    consume(first)
    assert first.prompt_tokens_processed == len(first.prompt_tokens)  # a cold cache: the whole prompt
    before = s.tokens
    assert before == first.prompt_tokens + first.tokens

    # count the target's forward positions directly up to the first chunk of turn 2
    target = s.decoder.target
    pos0 = target.positions
    at_first_chunk = []
    second = s.stream("second message", on_chunk=lambda c: at_first_chunk.append(target.positions))
    consume(second)
    prompt = second.prompt_tokens
    new = len(prompt) - len(before)
    assert prompt[:len(before)] == before and 0 < new < len(prompt) // 2
    # the cache held all but the last token of turn 1: feed that one and the new message
    assert second.prompt_tokens_processed == new + 1
    # prefill (new tokens but the last) + first round (last prompt token + k drafts)
    assert at_first_chunk[0] - pos0 == new + 1 + second.stats.k_history[0]
    assert s.last_stats is second.stats
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    assert s.stats.turns == 2 and s.stats.prompt_tokens_reused == len(before) - 1


def test_toggling_draft_keeps_the_target_cache(tiny_pair):
    s = Session(tiny_pair, max_tokens=8)
    s.send("one")
    s.drafting = False
    n = len(s.tokens)
    off = s.stream("two")
    consume(off)
    assert off.stats.draft_proposed == 0 and off.stats.drafter == "none" and s.current_k == 0
    assert off.prompt_tokens_processed == len(off.prompt_tokens) - n + 1
    s.drafting = True
    n = len(s.tokens)
    on = s.stream("three")
    consume(on)
    assert on.stats.draft_proposed > 0
    assert on.prompt_tokens_processed == len(on.prompt_tokens) - n + 1
    # same tokens as a session that never drafted
    plain = Session(tiny_pair, max_tokens=8, drafting=False)
    for text in ("one", "two", "three"):
        plain.send(text)
    assert plain.tokens == s.tokens


def test_cancel_from_another_thread_then_lossless(tiny_pair, tmp_path):
    s = Session(tiny_pair, max_tokens=12, num_draft=4)
    s.send("hello")
    s.eos_token_ids = set()  # nothing ends this reply but the cancel
    stream = s.stream("go on and on", max_tokens=3000)
    started, got = threading.Event(), []

    def run():
        for c in stream:
            got.append(c)
            started.set()

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30)
    assert s.cancel()
    passes_after_cancel = stream.stats.target_passes  # read after cancel(): at most one more round
    t.join(30)
    assert not t.is_alive()
    assert stream.finish_reason == "cancelled" and stream.reply.cancelled
    assert stream.stats.target_passes <= passes_after_cancel + 1
    assert stream.stats.generated_tokens < 3000
    assert not s.generating and not s.cancel()
    # the partial reply is kept, and the history is what was emitted
    assert s.messages[-1] == {"role": "assistant", "content": stream.reply.text}
    assert s.tokens == stream.prompt_tokens + stream.reply.tokens
    s.eos_token_ids = set(tiny_pair.eos_token_ids)
    path = s.save(tmp_path / "after_cancel.json")

    # the next generation on the same session equals plain decoding of the same history
    nxt = s.stream("and then?", max_tokens=30)
    consume(nxt)
    ref = mlxspec.generate(tiny_pair, nxt.prompt_tokens, max_tokens=30, drafter="none")
    assert nxt.tokens == ref.tokens and len(ref.tokens) > 0
    # ... and what a fresh session with drafting off gives from the saved state
    fresh = Session.load(path, tiny_pair, drafting=False)
    assert fresh.messages == s.messages[:-2] and not fresh.drafting
    plain = fresh.stream("and then?", max_tokens=30)
    consume(plain)
    assert plain.prompt_tokens == nxt.prompt_tokens
    assert plain.tokens == nxt.tokens and plain.stats.draft_proposed == 0


def test_cancel_can_drop_the_turn(tiny_pair):
    s = Session(tiny_pair, max_tokens=10, on_cancel="drop")
    s.send("keep this")
    messages, tokens = [dict(m) for m in s.messages], s.tokens
    s.eos_token_ids = set()
    stream = s.stream("drop this", max_tokens=500)
    next(stream)
    s.cancel()
    consume(stream)
    assert stream.finish_reason == "cancelled" and stream.tokens
    assert s.messages == messages and s.tokens == tokens  # as if the turn never happened
    s.eos_token_ids = set(tiny_pair.eos_token_ids)
    again = s.stream("something else", max_tokens=20)
    consume(again)
    assert again.prompt_tokens[:len(tokens)] == tokens
    ref = mlxspec.generate(tiny_pair, again.prompt_tokens, max_tokens=20, drafter="none")
    assert again.tokens == ref.tokens
    assert s.messages[-2]["content"] == "something else"


def test_one_generation_at_a_time(tiny_pair):
    s = Session(tiny_pair, max_tokens=10)
    stream = s.stream("first")
    assert s.generating
    with pytest.raises(MlxspecError, match="already generating"):
        s.stream("second")
    with pytest.raises(MlxspecError, match="already generating"):
        s.send("second")
    for change in (s.reset, lambda: setattr(s, "drafting", False), lambda: s.set_sampling(temp=1.0),
                   lambda: s.save("/nonexistent/x.json")):
        with pytest.raises(MlxspecError, match="while a reply is being generated"):
            change()
    # another thread is refused too, immediately (no blocking)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(MlxspecError, s.send, "third")))
    t.start()
    t.join(10)
    assert errors and not t.is_alive()
    consume(stream)
    assert not s.generating
    assert s.send("second").tokens  # free again
    # closing a stream early frees the session too
    with s.stream("third") as st:
        next(st)
    assert not s.generating and st.finish_reason == "cancelled"
    # a stream closed before it ran leaves no trace
    n = len(s.messages)
    s.stream("never mind").close()
    assert len(s.messages) == n and not s.generating
    s.reset()
    assert s.messages == [] and s.tokens == []


def test_callback_form(tiny_pair):
    s = Session(tiny_pair, max_tokens=15, system="you are a test")
    seen = []
    reply = s.send("hi", on_chunk=seen.append)
    assert seen and "".join(c.text for c in seen) == reply.text
    assert [c.token for c in seen if c.token >= 0] == reply.tokens
    assert sum(c.from_draft for c in seen) == reply.stats.draft_accepted
    assert s.conversation()[0] == {"role": "system", "content": "you are a test"}
    # a callback that raises ends the stream and frees the session
    with pytest.raises(RuntimeError):
        s.send("again", on_chunk=lambda c: (_ for _ in ()).throw(RuntimeError("app closed")))
    assert not s.generating and s.send("more").tokens


def test_context_limit_warns_instead_of_crashing(tiny_pair):
    s = Session(tiny_pair, max_tokens=50)
    s.eos_token_ids = set()
    s.context_length = 60
    reply = s.send("hello")
    assert reply.finish_reason == "context" and len(s.tokens) <= 60
    assert s.near_context_limit and s.context_left < 10
    messages = list(s.messages)
    with pytest.raises(ContextFullError, match="reset"):
        s.send("this no longer fits")
    assert s.messages == messages and not s.generating
    s.reset()
    assert not s.near_context_limit and s.send("hello").tokens


def test_save_json(tiny_pair, tmp_path):
    s = Session(tiny_pair, max_tokens=6, system="sys", temp=0.7, seed=3)
    s.send("a")
    s.send("b")
    path = s.save(tmp_path / "chat" / "conv.json")
    data = json.loads(path.read_text())
    assert data["format"] == "mlxspec.session.session"
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert data["messages"][0]["content"] == "sys" and data["messages"][3]["content"] == "b"
    assert data["settings"]["sampling"]["temp"] == 0.7 and data["settings"]["draft"] is True
    assert data["stats"]["turns"] == 2 and data["tokens"] == s.tokens
    back = Session.load(path, tiny_pair)
    assert back.conversation() == s.conversation() and back.tokens == s.tokens and back.temp == 0.7



@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """A tiny target (no draft) with room for prompts of many thousand tokens."""
    import tiny_models

    path = tiny_models.save_model_dir(tmp_path_factory.mktemp("long") / "m", "qwen2", max_pos=32768)
    return mlxspec.load(path)


def test_cancel_right_after_send_starts_is_never_lost(long_context_model):
    """A cancel() that arrives while the prompt is still being prepared (template,
    tokenising: a long message takes milliseconds) must still end that reply:
    60 trials, cancel issued 0-10 ms after send() started."""
    import random
    import time

    s = Session(long_context_model, max_tokens=40, on_cancel="drop")
    s.eos_token_ids = set()  # nothing but the cancel (or max tokens) ends a reply
    message = ("tell me a story about tokens " * 600)[:16000]
    rng = random.Random(0)
    lost = []
    for trial in range(60):
        delay = rng.uniform(0.0, 0.010)
        go = threading.Event()

        def cancel_later():
            go.wait()
            time.sleep(delay)
            s.cancel()

        t = threading.Thread(target=cancel_later)
        t.start()
        go.set()
        reply = s.send(message)  # "send started" = the moment go was set
        t.join(10)
        if reply.finish_reason != "cancelled" or len(reply.tokens) >= 40:
            lost.append((trial, round(delay * 1000, 2), reply.finish_reason, len(reply.tokens)))
            s.reset()  # the reply that ran on was kept: start the next trial from the same empty conversation
    assert not lost, f"{len(lost)} of 60 cancels lost (trial, ms, finish, tokens): {lost}"


def test_chat_template_errors_refuse_the_turn_and_keep_the_conversation(tiny_pair_dirs, tmp_path):
    import tiny_models

    strict = tiny_models.copy_with_chat_template(tiny_pair_dirs[0], tmp_path / "strict", tiny_models.STRICT_CHATML)
    pair = mlxspec.load(strict)
    s = Session(pair, max_tokens=5)
    s.send("hello")
    messages, tokens = [dict(m) for m in s.messages], s.tokens

    def refused(call, message):
        with pytest.raises(MlxspecError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value)
        assert s.messages == messages and s.tokens == tokens and not s.generating

    s.system = "talk like a pirate"
    refused(lambda: s.send("again"), "chat template cannot render this conversation: System role not supported")
    refused(lambda: s.stream("again"), "System role not supported")
    s.system = None
    refused(lambda: s.send("peek"), "SecurityError")
    # the conversation goes on, and saves
    assert s.send("and again").tokens and len(s.messages) == 4
    back = Session.load(s.save(tmp_path / "conv.json"), pair)
    assert back.messages == s.messages
    # the API says the same
    with pytest.raises(MlxspecError, match="System role not supported"):
        mlxspec.generate(pair, [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}], max_tokens=2)
