"""`--drafter lookup` with `--num-draft auto` (issue 61): prompt lookup drafts for every
model, with no draft model.  A round in which no n-gram matches costs nothing (a plain
step) and is no evidence against drafting, so a copy prompt gets drafted and accepted
tokens, and the output is plain greedy's.  A fallback note states the figures the rule
used, so it cannot read "acceptance (at most 1.00) is below the draft's cost (0.01 + ...)"."""

from __future__ import annotations

import re

import pytest

import mlxspec
from mlxspec import api
from mlxspec.core.stats import GenerationStats
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import PerToken
from mlxspec.drafting.drafters import PromptLookupDrafter

from server_process import MODEL, need_smollm2

TEXT = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
        "How vexingly quick daft zebras jump. Sphinx of black quartz, judge my vow.")
COPY = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{TEXT}"}]


def lookup_policy(cost=None):
    return api.make_policy(None, PromptLookupDrafter(), cost=cost or assumed(PromptLookupDrafter.relative_cost))


def test_the_lookup_drafter_is_priced_as_lookup():
    pol = lookup_policy()
    assert isinstance(pol, PerToken) and pol.sources == [(0.0, True)]


def test_rounds_without_a_match_are_not_evidence_against_drafting():
    pol = lookup_policy()
    stats = GenerationStats()
    pol.start(stats)
    for _ in range(200):  # a reply that never repeats anything
        k = pol.choose()
        assert k > 0, stats.notes
        rnd = pol.round(k)
        rnd.stop_reason = "no-match"  # what PromptLookupDrafter.propose does without a match
        pol.update(rnd, [], 1)
    assert not pol.fallback and not stats.notes
    assert pol.worth_drafting()


def test_the_fallback_note_states_the_figures_the_rule_used():
    """Rejected lookups until the rule falls back: the note's acceptance is below its bar."""
    pol = lookup_policy(assumed(0.01, slope=0.3))  # a verify that costs: rejections make drafting not pay
    stats = GenerationStats()
    pol.start(stats)
    for _ in range(400):
        k = pol.choose()
        if not k:
            pol.update(pol.round(0), [], 1)
            continue
        pol.update(pol.round(k), [(None, False)], 1)  # a lookup token proposed and rejected
    notes = [n for n in stats.notes if n.startswith("fallback")]
    assert notes, stats.notes
    # "(at most a)": the optimistic bound; a bare mean where the exploration ledger cannot pay for a try
    m = re.search(r"acceptance (?:\(at most )?([\d.]+)\)? is below the ([\d.]+) a draft token must reach", notes[0])
    assert m, notes[0]
    assert float(m.group(1)) < float(m.group(2)), notes[0]
    assert "lookup acceptance" in notes[0]


@pytest.mark.real
def test_lookup_auto_drafts_and_accepts_on_a_copy_prompt():
    need_smollm2()
    pair = mlxspec.load(MODEL, no_draft=True)
    plain = api.generate(pair, COPY, max_tokens=60, drafter="none")
    r = api.generate(pair, COPY, max_tokens=60, drafter="lookup", num_draft="auto")
    s = r.stats
    assert r.tokens == plain.tokens  # lossless: plain greedy's tokens
    assert not [n for n in s.notes if n.startswith("fallback")], s.notes
    assert 0 < s.draft_accepted <= s.draft_proposed, (s.draft_accepted, s.draft_proposed)
    assert s.tokens_per_pass >= 1.5 and s.target_passes < s.generated_tokens
    assert s.tokens_speculative > s.tokens_plain
    print(f"lookup+auto on a copy prompt: drafted {s.draft_proposed}, accepted {s.draft_accepted}, "
          f"{s.generated_tokens} tokens in {s.target_passes} passes ({s.tokens_per_pass:.2f} tokens/pass), "
          f"speculative {s.tokens_speculative} / plain {s.tokens_plain}")


def test_tokens_per_pass_is_never_below_one():
    """A reply whose EOS came in a pass of its own: 1 token generated in 2 passes still
    decided at least one token per pass (the old generated/passes read 0.50)."""
    s = GenerationStats()
    s.record_round(0, 0, 1)  # a plain step: one token
    s.record_round(3, 0, 0)  # a drafting round, all rejected; its own token was the EOS
    s.generated_tokens, s.finish_reason = 1, "stop"
    assert s.tokens_per_pass == 1.0
    assert s.to_dict()["tokens_per_pass"] == s.tokens_per_pass
    assert "1.00 tokens/pass" in s.summary() or s.draft_proposed == 3
    s.record_round(4, 3, 4)
    s.generated_tokens += 4
    assert s.draft_accepted <= s.draft_proposed and s.tokens_per_pass == pytest.approx((5 + 1) / 3)


def test_session_totals_count_each_replys_eos():
    from mlxspec.session.totals import SessionStats

    t = SessionStats()
    for _ in range(3):
        s = GenerationStats()
        s.record_round(0, 0, 1)
        s.record_round(0, 0, 0)
        s.generated_tokens, s.finish_reason = 1, "stop"
        t.add(s)
    assert t.total.tokens_per_pass == 1.0 and t.to_dict()["tokens_per_pass"] == 1.0
