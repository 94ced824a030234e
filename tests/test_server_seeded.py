"""Same seed, same text through `mlxspec serve` (issue 59): a request with a `seed` gets
the coupled sampler, so its text is the plain run's token for token whatever the server
drafts (`num_draft_tokens` 0, 3, auto); `sampling: "rejection"` is taken per request (exact,
not seed-stable) and a bad value is a 400 naming the field."""

from __future__ import annotations

import pytest

from server_process import error_of, start_tiny

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "w17 w3 w99 w3 w17"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_tiny(tmp_path_factory, "serve-seeded", "--num-draft-tokens", "3")
    yield s
    s.stop()


def reply(server, **fields) -> dict:
    status, body, _ = server.post(CHAT, {"messages": MSG, "max_tokens": 40, "temperature": 0.9, **fields})
    assert status == 200, body
    return body


def test_a_seed_fixes_the_text_whatever_the_server_drafts(server):
    plain = reply(server, seed=7, num_draft_tokens=0)
    text = plain["choices"][0]["message"]["content"]
    assert plain["usage"]["completion_tokens"] == 40
    for nd in (3, "auto"):
        spec = reply(server, seed=7, num_draft_tokens=nd)
        assert spec["choices"][0]["message"]["content"] == text, nd
        if nd == 3:  # it really drafted (auto may price drafts too dear on a busy machine: same text either way)
            assert spec["speculative"]["accepted"] > 0, spec["speculative"]
    other = reply(server, seed=8, num_draft_tokens=3)["choices"][0]["message"]["content"]
    assert other != text  # the seed decides the text: not a constant


def test_sampling_is_chosen_per_request(server):
    rej = reply(server, seed=7, sampling="rejection", num_draft_tokens=3)
    assert rej["usage"]["completion_tokens"] == 40
    status, body, _ = server.post(CHAT, {"messages": MSG, "max_tokens": 4, "temperature": 0.9, "sampling": "gumbel"})
    err = error_of(status, body, 400)
    assert err["param"] == "sampling" and "coupled" in err["message"]
