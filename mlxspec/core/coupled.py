"""Coupled sampling (issue 59): same seed, same text, whatever the draft.

Plain decoding samples the token at absolute position t of the history (the
index it will have in the token list) as

    y_t = argmax_v ( log p_t(v) + g_t(v) ),

g_t i.i.d. standard Gumbel noise over the target's vocabulary rows, fixed by
(seed, t) alone: the Gumbel-max trick, an exact sample from p_t (p_t processed as
usual: repetition penalty, temperature, top-k, top-p, min-p).  The draft proposes
argmax(log q_t + g_t) with the *same* g_t; the target keeps a drafted token iff it
equals its own y_t and emits y_t at the first mismatch (or at the bonus position
when every draft is kept); a tree follows the child equal to y_t.  A lookup
proposal (deterministic) is kept iff it equals y_t.  So every emitted token is
y_t of the plain run: the output equals the plain run's token for token, for any
drafter, k, tree, calibration or machine, and is exactly distributed as p.  What
the draft, k or a rollback does never changes which noise a position gets.

Noise derivation (fixed, documented, deterministic across processes and
machines): position t's key is `mx.random.key(position_seed(seed, t))` with
`position_seed` = splitmix64(splitmix64(seed) + t) mod 2^64, and g_t =
`mx.random.gumbel(shape=(V,), key)` in float32, V the target's vocabulary rows
(the draft's q is fitted to those rows, token_ids.fit_rows, so ids line up).

Greedy (temp 0) is untouched: it never reaches this module.
"""

from __future__ import annotations

import mlx.core as mx

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """The MLX seed of absolute position `position` under `seed`."""
    return splitmix64((splitmix64(seed) + position) & MASK64)


def gumbel_at(seed: int, position: int, rows: int) -> mx.array:
    """g_t: (rows,) float32 standard Gumbel noise for position t."""
    return mx.random.gumbel(shape=(rows,), key=mx.random.key(position_seed(seed, position)))


class Coupling:
    """One generation's noise source: (seed, position) -> g_t, memoised for the
    positions a round may revisit (a tree's rows at one depth share one g_t)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._memo: dict[tuple[int, int], mx.array] = {}

    def noise(self, position: int, rows: int) -> mx.array:
        key = (position, rows)
        g = self._memo.get(key)
        if g is None:
            g = self._memo[key] = gumbel_at(self.seed, position, rows)
        return g

    def rows(self, positions, rows: int) -> mx.array:
        """(len(positions), rows) noise, one row per position."""
        return mx.stack([self.noise(int(t), rows) for t in positions])

    def forget_before(self, position: int) -> None:
        """Drop noise for positions before `position` (the history is past them)."""
        for key in [k for k in self._memo if k[0] < position]:
            del self._memo[key]

    def choose(self, logprobs: mx.array, positions) -> mx.array:
        """argmax(log p + g) per row of (N, V) processed log-probabilities: the coupled choice."""
        return mx.argmax(logprobs + self.rows(positions, logprobs.shape[-1]), axis=-1)

    def perturbed(self, logprobs: mx.array, positions) -> mx.array:
        return logprobs + self.rows(positions, logprobs.shape[-1])


def new_coupling(seed: int | None) -> Coupling:
    """A Coupling for `seed`; without one a random seed (still exact, not reproducible)."""
    if seed is None:
        import random

        seed = random.SystemRandom().randrange(2**63)
    return Coupling(seed)
