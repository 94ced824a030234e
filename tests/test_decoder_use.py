"""`SpeculativeDecoder.use`: the one way Session and serve swap the drafter and policy.

What a swap must carry along besides the two objects: the target's merge limit for
re-fed positions on a recurrent target (core/recurrent.py), which comes from the policy's
cost model; a decoder built plain and switched on later (Session's way) used to keep
the default limit."""

import tiny_hybrid
from mlxspec.core.cache import MERGE_LIMIT
from mlxspec.costs.cost_model import CostModel, merge_limit
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import Drafter, ModelDrafter
from mlxspec.session.drafting import Drafting
from mlxspec.decoder import SpeculativeDecoder


def steep():
    """A cost model whose verify width is dear: few re-fed positions may ride along."""
    return CostModel(0.1, [1 + 0.3 * (w - 1) for w in range(1, 18)])


def test_switching_drafting_on_carries_the_policys_merge_limit():
    target, draft = tiny_hybrid.build("qwen3_5", seed=0), tiny_hybrid.build("qwen2", seed=2)
    cm = steep()
    assert merge_limit(cm) != MERGE_LIMIT  # else this test could not tell
    decoder = SpeculativeDecoder(target, Drafter(), FixedK(0))  # how Session starts: plain
    assert decoder.target.merge_limit == MERGE_LIMIT
    drafter = ModelDrafter(draft)
    decoder.use(drafter, PerToken(cm, 4, model=True, refeed=True))
    assert decoder.target.merge_limit == merge_limit(cm)
    assert decoder.drafter is drafter and decoder.policy.cost is cm
    decoder.use(Drafter(), FixedK(0))  # back to plain: no cost model, the limit stays
    assert decoder.target.merge_limit == merge_limit(cm)


def test_session_drafting_switch_goes_through_use(monkeypatch):
    """Drafting.switch and set_num_draft call decoder.use (not attribute writes)."""
    target, draft = tiny_hybrid.build("qwen3_5", seed=0), tiny_hybrid.build("qwen2", seed=2)
    decoder = SpeculativeDecoder(target, Drafter(), FixedK(0))
    calls = []
    real = decoder.use
    monkeypatch.setattr(decoder, "use", lambda d, p: (calls.append((d, p)), real(d, p)))
    drafting = Drafting.__new__(Drafting)  # only the swap is under test: no pair, no tokenizer
    drafting.decoder, drafting.pair, drafting.p_min = decoder, None, 0.0
    drafting._choice, drafting._drafter = "model", ModelDrafter(draft)
    drafting._plain, drafting._spec, drafting.on, drafting.num_draft = (decoder.drafter, decoder.policy), None, False, 2
    drafting.num_draft_max, drafting.draft_vocab, drafting.cost_profile = None, None, None  # Drafting's defaults
    drafting.switch(True)
    drafting.set_num_draft(3)
    drafting.switch(False)
    assert [type(p).__name__ for _, p in calls] == ["FixedK", "FixedK", "FixedK"]
    assert [getattr(p, "k", None) for _, p in calls] == [2, 3, 0]
