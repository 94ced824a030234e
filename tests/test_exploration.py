"""What drafting on hope costs (costs/exploration.py): tries and probes are paid from a
ledger, so a short reply with a poor draft stays close to plain decoding where a round
is dear, while a draft that pays is never held back.  Synthetic rounds (policy_util.py)
under the shipped Apple profiles' cost models: counts only, no clock."""

import pytest

from mlxspec.core.stats import GenerationStats
from mlxspec.costs import profiles
from mlxspec.costs.draft_length import PerToken
from mlxspec.costs.exploration import PROBE_SHARE
from policy_util import reply, uniform

DEAR = ("apple-m1-7b", "apple-m3plus-1.5b")  # a dear verify position; a dear draft step


@pytest.mark.parametrize("profile", DEAR)
@pytest.mark.parametrize("seed", range(3))
def test_a_poor_draft_costs_a_short_reply_little_where_rounds_are_dear(profile, seed):
    """A draft that is never kept, 40 tokens: the first round tries (nothing is known of
    the prompt), later tries and probes wait for the ledger.  Before: two or three
    rounds on the prior's hope, a probe after 16 plain tokens (0.93-0.96x)."""
    speed, lengths = reply(profile, lambda c: 0.0, seed=seed)
    assert speed >= 0.975, (speed, lengths)
    assert sum(n > 0 for n in lengths) <= 1, lengths


def test_a_try_hopes_for_its_first_token_only():
    """Under apple-m1-7b a verify position costs 0.64 plain steps: the prior's hope (an
    acceptance bound of 1.0 on no evidence) must not buy a second token of a first round
    that the mean acceptance would not draft; where a round is cheap (apple-m3plus-32b)
    the first round drafts on as before."""
    def first_round(profile):
        pol = PerToken(profiles.profile_cost(profile), 12)
        pol.start(GenerationStats())
        rnd = pol.round(pol.choose())
        n = 0
        while rnd.more() and rnd.offer(0.97):
            n += 1
        return n

    assert first_round("apple-m1-7b") == 1
    assert first_round("apple-m3plus-32b") >= 4


@pytest.mark.parametrize("profile", DEAR + ("apple-m3plus-7b", "apple-m3plus-32b"))
def test_a_draft_that_pays_is_not_held_back(profile):
    """Kept 90 % of the time with a confident draft: every round drafts, dear profile or not."""
    speed, lengths = reply(profile, lambda c: 0.9, tokens=300, confidence=uniform(0.9, 1.0))
    assert all(n > 0 for n in lengths), lengths
    assert speed > 1.0


def test_probes_of_a_long_poor_reply_stay_within_the_share():
    """Under apple-m3plus-7b (cheap tries) a long reply with a draft kept 10 % of the time
    still probes, and what the tries cost stays within about PROBE_SHARE of plain decoding."""
    speed, lengths = reply("apple-m3plus-7b", lambda c: 0.1, tokens=600)
    assert sum(n > 0 for n in lengths[100:]) >= 3  # it keeps probing
    assert speed >= 1 / (1 + 1.5 * PROBE_SHARE), speed
