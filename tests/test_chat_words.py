"""What chat and Session say (issue 13, item 9): a fallback is named as one, and a
session without drafts shows no tokens-per-pass figure."""

import mlxspec
from mlxspec.commands.chat import reply_summary
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import PerToken
from mlxspec.session.session import Session


def test_reply_summary_says_when_drafting_fell_back(tiny_pair):
    s = Session(tiny_pair, max_tokens=10, num_draft="auto")
    # the real per-token policy, told a draft step costs three target steps: after its first
    # probe round (whose drafts may all be kept) it falls back to plain decoding
    s.decoder.policy = PerToken(assumed(3.0), 4)
    reply = s.send("hello there")
    line = reply_summary(s, reply.stats)
    assert s.decoder.policy.fallback
    assert "k=0: fell back to plain decoding" in line, line
    assert "finish: length (max tokens reached)" in line, line


def test_reply_summary_with_drafting_on_gives_k(tiny_pair):
    s = Session(tiny_pair, max_tokens=10, num_draft=3)
    line = reply_summary(s, s.send("hello there").stats)
    assert "k=3" in line and "fell back" not in line, line
    s = Session(tiny_pair, max_tokens=10, num_draft="auto")
    s.decoder.policy = PerToken(assumed(0.01), 5)  # drafting almost free: it keeps drafting
    line = reply_summary(s, s.send("hello there").stats)
    assert "k=auto (up to 5, " in line and "fell back" not in line, line


def test_stats_without_drafts_show_no_tokens_per_pass(tiny_pair_dirs):
    pair = mlxspec.load(tiny_pair_dirs[0])
    s = Session(pair, max_tokens=20)
    for text in ("hello", "and again", "once more"):
        s.send(text)
    summary = s.stats.summary()
    assert "tokens/pass" not in summary and "target passes" in summary, summary
    assert "nothing drafted" in summary
