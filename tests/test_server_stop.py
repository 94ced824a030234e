"""Stop strings of `mlxspec serve` (server_stream.StopMatcher): the text sent is the
reply up to the earliest stop string, however the reply is cut into pieces, and
nothing that could still become a stop string is sent early."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.server.responses import StopMatcher


def run(pieces, stops):
    m = StopMatcher(stops)
    out = []
    for i, p in enumerate(pieces):
        out += m.feed(p, i % 2 == 0)
    return out, m.flush(), m.stopped


def test_stop_string_across_pieces():
    out, rest, stopped = run(["Hel", "lo W", "orld"], ["lo W"])
    assert out == [("He", True), ("l", True)] and rest == [] and stopped  # "l" waited: it might start "lo W"


def test_a_possible_stop_is_held_back_then_released():
    m = StopMatcher(["bc"])
    assert m.feed("ab", True) == [("a", True)]  # "b" may start "bc"
    assert m.feed("d", False) == [("b", True), ("d", False)]  # it did not: sent, with its own draft flag
    assert m.feed("xb", True) == [("x", True)]
    assert m.flush() == [("b", True)] and not m.stopped


def test_no_stops_passes_everything():
    assert run(["a", "", "b"], []) == ([("a", True), ("b", True)], [], False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("abc", max_size=4), max_size=8), st.lists(st.text("abc", min_size=1, max_size=3), max_size=3))
def test_matches_the_earliest_stop(pieces, stops):
    # the reply ends at the first piece after which the text holds a stop string, cut at the
    # earliest one there: a longer stop that starts earlier but would only complete in a later
    # piece never does (pieces ["c", "a", "b"], stops ["a", "cab"]: the reply is "c")
    text, hits = "", []
    for piece in pieces:
        text += piece
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            break
    out, rest, stopped = run(pieces, stops)
    assert "".join(t for t, _ in out + rest) == (text[: min(hits)] if hits else text)
    assert stopped == bool(hits)


def test_logprob_entries_ride_with_the_text_they_belong_to():
    """With logprobs asked for, each token's entry comes out once, with the first piece released after it;
    a token with no text yet waits for the next; a stop string's tokens are dropped with it."""
    from types import SimpleNamespace as Chunk

    def feed(m, text, token):
        return m.feed(text, False, Chunk(token=token, logprobs=(-0.5, [(token, -0.5)])))

    for stops in ([], ["STOP"]):
        m = StopMatcher(stops, track=True)
        out = feed(m, "", 1) + feed(m, "é", 2) + feed(m, " a", 3) + feed(m, " ST", 4) + feed(m, "OP!", 5) + m.flush()
        sent = [(t, [e[0] for e in es]) for t, _, es in out]
        if stops:
            assert "".join(t for t, _ in sent) == "é a " and [e for _, es in sent for e in es] == [1, 2, 3, 4]
        else:
            assert sent == [("é", [1, 2]), (" a", [3]), (" ST", [4]), ("OP!", [5])]
    assert StopMatcher(["x"]).feed("ab", True, Chunk(token=1, logprobs=(0.0, []))) == [("ab", True)]  # not tracking
