"""A Session's drafting switch: which drafter drafts, and turning it on and off.

Turning drafting off swaps the decoder's drafter and policy for plain decoding;
the target's KV cache is the decoder's, so toggling never re-processes the
conversation on the target (a draft model catches up on what it missed when it
is turned back on).  The drafter and its policy are built once, when drafting is
first turned on.
"""

from __future__ import annotations

from ..api import make_drafter, make_policy
from ..drafting.drafters import Drafter
from ..errors import MlxspecError
from ..drafting.registry import check_drafter


class Drafting:
    def __init__(self, pair, decoder, drafter=None, num_draft=None, p_min: float = 0.0,
                 max_kv_size: int | None = None, *, num_draft_max=None, draft_vocab=None, cost_profile=None):
        if drafter is None:
            drafter = "model" if pair.draft is not None else "none"
        if isinstance(drafter, str) and drafter in ("model", "hybrid") and pair.draft is None:
            raise MlxspecError(f"drafter {drafter!r} needs a draft model: give draft=MODEL, or use "
                               "drafter='lookup' (prompt n-grams, no draft model)")
        self.pair, self.decoder = pair, decoder
        self.num_draft, self.p_min = num_draft, p_min
        self.num_draft_max, self.draft_vocab, self.cost_profile = num_draft_max, draft_vocab, cost_profile
        self.max_kv_size = max_kv_size  # a draft model's KV cache is bounded as the target's
        if not isinstance(drafter, Drafter):
            check_drafter(drafter)  # the CLI's rule (core/options.py)
        self.name = drafter.name if isinstance(drafter, Drafter) else drafter
        self._choice = drafter  # a name is built into a Drafter when drafting is first turned on
        self._drafter = drafter if isinstance(drafter, Drafter) else None
        self._plain = (decoder.drafter, decoder.policy)
        self._spec = None  # (drafter, policy), built when drafting is first turned on
        self.on = False

    @property
    def available(self) -> bool:
        return self._choice != "none"

    def switch(self, on: bool):
        if on and self._spec is None:
            if self._choice == "none":
                raise MlxspecError("nothing to draft with: no draft model is loaded (create the Session with "
                                   "draft=MODEL, or drafter='lookup' to draft from the conversation itself)")
            if self._drafter is None:
                self._drafter = make_drafter(self.pair, self._choice, self.p_min, draft_vocab=self.draft_vocab,
                                             max_kv_size=self.max_kv_size)
            self._spec = (self._drafter, self._policy(self.num_draft))
        self.decoder.use(*(self._spec if on else self._plain))
        self.on = on

    def set_num_draft(self, value):
        self.num_draft = value
        if self._spec is not None:
            self._spec = (self._spec[0], self._policy(value))
            if self.on:
                self.decoder.use(*self._spec)

    def _policy(self, num_draft):
        return make_policy(num_draft, self._drafter, self.pair, num_draft_max=self.num_draft_max,
                           cost_profile=self.cost_profile)

    def reset(self):
        if self._drafter is not None:
            self._drafter.reset()
