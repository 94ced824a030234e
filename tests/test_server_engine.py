"""The engine behind `mlxspec serve`, in this process: one decoder serves requests
with different draft lengths (a server default of auto with draft trees, a
request's fixed k, drafting off), each exactly the target's greedy output."""

from __future__ import annotations

import pytest

import mlxspec
from mlxspec import api
from mlxspec.costs import cost_model
from mlxspec.core.sampling import SamplingParams
from mlxspec.server.engine import Engine, Job

from server_process import MODEL, need_smollm2

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def pair():
    need_smollm2()
    return mlxspec.load(MODEL, MODEL)


def run(engine, history, num_draft, n=16, stop=()):
    job = Job(list(history), SamplingParams(), n, list(stop), num_draft)
    engine.run(job)
    events = []
    while not job.events.empty():
        events.append(job.events.get())
    assert events and events[-1][0] == "done", events
    return "".join(e[1] for e in events if e[0] == "text"), events[-1]


def test_request_draft_lengths_on_a_tree_decoder(pair):
    messages = [{"role": "user", "content": "List the planets of the solar system."}]
    ref = api.generate(pair, messages, max_tokens=16, drafter="none").text
    decoder = api.make_decoder(pair, cost=cost_model.assumed(1.0))  # auto, without a calibration run
    assert decoder.trees, decoder.tree_note  # the pair verifies draft trees by default
    engine = Engine(pair, decoder, None, max_queue=2)
    history = api.encode_prompt(pair.tokenizer, messages)
    for i, (num_draft, effective) in enumerate(((None, "auto"), (2, 2), (0, 0), ("auto", "auto"), (None, "auto"))):
        text, (_, stats, finish, used) = run(engine, history, num_draft)
        assert text == ref and used == effective and finish == "length"
        if num_draft == 0:
            assert stats.draft_proposed == 0 and stats.drafter == "none"
        elif num_draft == 2:
            assert 0 < stats.draft_proposed <= 2 * stats.target_passes  # chains of at most 2
        # the same prompt again: the cache holds it, only its last token is fed (its logits are needed)
        assert stats.prompt_tokens_processed == (len(history) if i == 0 else 1)
    assert decoder.trees and decoder.policy is engine.default[1]  # the server's own setting is back
