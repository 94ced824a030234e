"""Draft-length policies: how many tokens to draft in the next round.

`FixedK` always drafts k (mlx-lm drafts 3).  A policy sees every round's
outcome through `update`, so adaptive policies can learn from acceptance and
timing; returning 0 from `choose` means "plain decoding for this step".
"""

from __future__ import annotations


class FixedK:
    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"num_draft must be >= 0, got {k}")
        self.k = k
        self.name = f"k={k}"

    def choose(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int, draft_time: float, verify_time: float) -> None:
        pass
