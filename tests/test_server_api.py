"""`mlxspec serve` with the official `openai` client, curl and `mlxspec generate`: the
server's greedy text is the target's own greedy text; usage and the speculative
stats are present and consistent; a follow-up chat turn feeds only its new part."""

from __future__ import annotations

import json
import subprocess

import pytest

from mlxspec import api
from mlxspec.core.cache import common_prefix

from cli_util import run_cli
from server_process import MODEL, SMOLLM2, error_of, start, target  # noqa: F401 (target: a fixture)

pytestmark = pytest.mark.real

openai = pytest.importorskip("openai", reason="the server tests need the `openai` package (pip install -e '.[test]')")

KEY = "test-key-123"
N = 24


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(tmp_path_factory, "serve-api", *SMOLLM2, "--num-draft-tokens", "3", api_key=KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def reference(target, prompt, max_tokens=N, chat=True):
    return api.generate(target, prompt, max_tokens=max_tokens, drafter="none", chat_template=chat)


def check_stats(usage, spec, n_prompt, n_completion):
    """usage and the speculative object agree with each other and with the request."""
    assert usage.prompt_tokens == n_prompt and usage.completion_tokens == n_completion
    assert usage.total_tokens == n_prompt + n_completion
    assert spec["prompt_tokens"] == n_prompt and spec["generated_tokens"] == n_completion
    assert spec["prompt_tokens_processed"] + spec["prompt_tokens_reused"] == n_prompt
    assert 1 <= spec["prompt_tokens_processed"] <= n_prompt
    assert usage.prompt_tokens_details.cached_tokens == spec["prompt_tokens_reused"]
    assert spec["drafter"] == "draft-model" and spec["num_draft_tokens"] == 3
    assert 0 < spec["accepted"] <= spec["drafted"]  # SmolLM2 drafting for itself: it drafts, and mostly agrees
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted"] / spec["drafted"], abs=1e-4)
    assert spec["target_passes"] < n_completion  # more than one token per target pass
    passes = spec["target_passes"]  # the EOS that ended a reply counts as a token its pass decided
    assert any(spec["tokens_per_pass"] == pytest.approx((n_completion + e) / passes, abs=1e-4) for e in (0, 1))
    assert spec["tokens_per_pass"] >= 1
    assert spec["fallback"] is False


def test_chat_with_openai_client(server, client, target):
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    ref = reference(target, messages)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0)
    assert r.object == "chat.completion" and r.model == MODEL
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ("length" if len(ref.tokens) == N else "stop")
    n_prompt = len(api.encode_prompt(target.tokenizer, messages))
    check_stats(r.usage, r.model_extra["speculative"], n_prompt, len(ref.tokens))


def test_chat_streaming_with_openai_client(server, client, target):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"}]
    ref = reference(target, messages)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2 and "".join(pieces) == ref.text  # streamed piece by piece
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length" if len(ref.tokens) == N else "stop"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None  # usage (and stats) in the final chunk, as OpenAI
    n_prompt = len(api.encode_prompt(target.tokenizer, messages))
    check_stats(last.usage, last.model_extra["speculative"], n_prompt, len(ref.tokens))
    # which pieces came from accepted drafts (for the chat page): some did, some were the target's own
    flags = [c.choices[0].model_extra.get("from_draft") for c in chunks if c.choices and c.choices[0].delta.content]
    assert True in flags and False in flags


def test_completions_with_openai_client(server, client, target):
    prompt = "def fibonacci(n):"
    ref = reference(target, prompt, chat=False)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0)
    assert r.choices[0].text == ref.text
    check_stats(r.usage, r.model_extra["speculative"], len(api.encode_prompt(target.tokenizer, prompt)),
                len(ref.tokens))
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    # token ids as the prompt
    ids = api.encode_prompt(target.tokenizer, prompt)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=N, temperature=0)
    assert r.choices[0].text == ref.text


def test_stop_strings(server, client, target):
    prompt = "The days of the week are Monday,"
    ref = reference(target, prompt, chat=False)
    words = ref.text.split()
    assert len(words) > 3, ref.text
    stop = " " + words[2]
    expected = ref.text[: ref.text.index(stop)]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0, stop=[stop, "zzzz"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0, stop=stop,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_greedy_text_equals_mlxspec_generate(server, client, tmp_path):
    prompt = "Write a haiku about the sea."
    res = run_cli(tmp_path, "generate", *SMOLLM2, "--num-draft", "3", "--max-tokens", str(N), "--json",
                  "--prompt", prompt)
    assert res.returncode == 0, res.stderr
    cli = json.loads(res.stdout)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=N)
    assert r.choices[0].message.content == cli["text"]
    assert r.usage.completion_tokens == len(cli["tokens"])


def test_multi_turn_feeds_only_the_new_message(server, client, target):
    tok = target.tokenizer
    turn1 = [{"role": "user", "content": "Give me a short list of fruits."}]
    ref1 = reference(target, turn1)
    r1 = client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=N)
    assert r1.choices[0].message.content == ref1.text
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "Which of them is the sweetest?"}]
    ref2 = reference(target, turn2)
    r2 = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=N)
    assert r2.choices[0].message.content == ref2.text  # reuse changes nothing in the output
    tokens1 = api.encode_prompt(tok, turn1) + ref1.tokens
    tokens2 = api.encode_prompt(tok, turn2)
    shared = common_prefix(tokens1, tokens2)
    assert shared > len(api.encode_prompt(tok, turn1))  # the reply itself is part of the shared prefix
    new_part = len(tokens2) - shared  # the new message and its template tokens
    spec = r2.model_extra["speculative"]
    assert new_part <= spec["prompt_tokens_processed"] <= new_part + 1, (spec, new_part, len(tokens2))
    assert spec["prompt_tokens_reused"] == len(tokens2) - spec["prompt_tokens_processed"]
    assert r2.usage.prompt_tokens_details.cached_tokens == spec["prompt_tokens_reused"]


def test_num_draft_tokens_per_request(server, client, target):
    messages = [{"role": "user", "content": "Count from one to ten in words."}]
    ref = reference(target, messages)
    off = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N,
                                         extra_body={"num_draft_tokens": 0})
    spec = off.model_extra["speculative"]
    assert off.choices[0].message.content == ref.text
    assert spec["num_draft_tokens"] == 0 and spec["drafted"] == 0 and spec["target_passes"] == len(ref.tokens)
    two = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N,
                                         extra_body={"num_draft_tokens": 2})
    spec = two.model_extra["speculative"]
    assert two.choices[0].message.content == ref.text
    assert spec["num_draft_tokens"] == 2 and 0 < spec["drafted"] <= 2 * spec["target_passes"]


def test_api_key(server, client):
    for key in (None, "wrong-key"):
        status, body, _ = server.request("GET", "/v1/models", headers=server.headers(key))
        assert error_of(status, body, 401)["type"] == "authentication_error"
        status, body, _ = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                                      headers=server.headers(key))
        error_of(status, body, 401)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.health()["status"] == "ok"  # /health needs no key


def test_curl(server, target):
    messages = [{"role": "user", "content": "Say hello."}]
    ref = reference(target, messages, max_tokens=8)
    out = subprocess.run(["curl", "-sS", "-N", f"{server.url}/v1/chat/completions", "-H", "Content-Type: application/json",
                          "-H", f"Authorization: Bearer {KEY}", "-d",
                          json.dumps({"messages": messages, "max_tokens": 8, "stream": True})],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    events = [ln[6:] for ln in out.stdout.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == ref.text
