"""Draft-length policies: how many tokens to draft in the next round.

`FixedK` always drafts k (mlx-lm drafts 3).  A policy sees every round's
outcome through `update`, so adaptive policies can learn from acceptance and
timing; returning 0 from `choose` means "plain decoding for this step".

`AdaptiveK` (`--num-draft auto`, the default) models speed and picks the best k:

* cost, measured on this machine: draft(k) = k x (median time of one draft step),
  verify(k) = median time of a target pass over k+1 positions for each k seen
  recently, a least-squares line through those for k not seen (before two k are
  seen, a prior of +10 % per extra position);
* acceptance by position, online: a_i = P(draft i kept | drafts before it kept),
  exponentially weighted counts with a weak prior;
* expected speed: E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j over
  time(k) = draft(k) + verify(k); the choice is the k with the highest ratio.
* fallback: when the best predicted speed-up over plain decoding (k = 0, one
  target pass over one position) is below 1, draft nothing; after `probe_every`
  plain tokens, probe with two one-token drafts (forgetting half of what it knew
  about acceptance, so the probe counts), and double the wait after each probe
  that does not pay (up to `max_probe_every`).  The wait is also long enough for
  probes to cost at most `probe_budget` (3 %) of plain decoding time: a probe's
  cost over plain steps is measured (it includes the draft catching up on the
  tokens it missed), so a costly draft probes rarely.  When a generation starts
  the policy probes again, since a new prompt may suit the drafter better.

A short explanation goes to `stats.notes` when fallback engages; `stats.tokens_plain`
and `stats.tokens_speculative` count the tokens produced in each mode.
"""

from __future__ import annotations

import statistics
from collections import deque


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


class AdaptiveK:
    name = "auto"

    def __init__(self, max_k: int = 8, *, start_k: int = 1, explore: tuple = (None, 0),
                 prior_accept: float = 0.5, prior_weight: float = 1.0, decay: float = 0.9,
                 window: int = 8, verify_slope_prior: float = 0.1,
                 neighbour_every: int = 12, refresh_plain_every: int = 32,
                 probe_every: int = 16, max_probe_every: int = 512, probe_rounds: int = 2,
                 probe_budget: float = 0.03, resume_above: float = 1.0, draft_cost_prior: float | None = None,
                 cost_model: tuple[float, float] | None = None, min_draft_rounds: int = 4):
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        self.max_k = max_k
        self.start_k = min(start_k, max_k)
        # the first rounds: `start_k` drafts (None), then one plain pass to time k = 0;
        # a cautious start, since a draft that cannot pay should cost little to detect
        self.explore = [self.start_k if k is None else min(k, max_k) for k in explore]
        self.prior_accept, self.prior_weight, self.decay = prior_accept, prior_weight, decay
        self.window, self.verify_slope_prior = window, verify_slope_prior
        self.neighbour_every, self.refresh_plain_every = neighbour_every, refresh_plain_every
        self.probe_every0, self.max_probe_every, self.probe_rounds = probe_every, max_probe_every, probe_rounds
        self.resume_above, self.probe_budget = resume_above, probe_budget
        self.draft_cost_prior = draft_cost_prior  # seconds per draft step, before any is measured
        # (draft step cost, verify slope) relative to a plain step: used instead of
        # wall-clock timings, so that k -- and a seeded sample -- is reproducible
        self.cost_model = cost_model
        # evidence needed before giving up on drafting: the first rounds' timings are
        # cold (allocation, first graphs), and one unlucky rejection says little
        self.min_draft_rounds = min_draft_rounds
        self.draft_rounds = 0
        self.acc = [0.0] * max_k  # exponentially weighted counts, by position
        self.tot = [0.0] * max_k
        self.verify_times: dict[int, deque] = {}
        self.draft_steps: deque = deque(maxlen=window)
        self.rounds = 0
        self.fallback = False
        self.fallbacks = 0
        self.probe_every = probe_every  # the backoff schedule, in plain tokens
        self.probe_wait = probe_every  # the wait now: the schedule, or longer for a costly probe
        self.probe_overhead = None  # seconds a probe took beyond plain steps for its tokens
        self._probe_time = self._probe_tokens = 0.0
        self.plain_since_probe = 0
        self.probing = 0
        self.stats = None
        self._queue = list(self.explore)

    # -- the loop's hooks ------------------------------------------------------
    def start(self, stats) -> None:
        """A new generation: notes go to its stats; if speculation was paused, probe first."""
        self.stats = stats
        if self.fallback:
            self._start_probe()

    def choose(self) -> int:
        if self._queue:
            return self._queue.pop(0)
        if self.probing:
            return 1  # position 1's acceptance decides whether drafting can pay at all
        if self.fallback:
            if self.plain_since_probe >= self.probe_wait:
                self._start_probe()
                return self.choose()
            return 0
        best, speedup = self.best()
        if speedup < 1.0 and self.draft_rounds >= self.min_draft_rounds:
            self._engage_fallback(speedup)
            return 0
        if self.refresh_plain_every and self.rounds % self.refresh_plain_every == self.refresh_plain_every - 1:
            return 0  # keep the baseline (plain step) timing fresh
        if self.neighbour_every and self.rounds % self.neighbour_every == self.neighbour_every - 1:
            return min(best + 1, self.max_k)  # learn the cost and acceptance one step further
        return best

    def update(self, k: int, n_accepted: int, draft_time: float, verify_time: float) -> None:
        if self.cost_model is not None:
            step, slope = self.cost_model
            draft_time, verify_time = step * k, 1.0 + slope * k
        self.rounds += 1
        self.draft_rounds += k > 0
        if self.rounds > 1:  # the first round's timings are cold: not representative
            self.verify_times.setdefault(k, deque(maxlen=self.window)).append(verify_time)
            if k > 0:
                self.draft_steps.append(draft_time / k)
        if k > 0:
            for i in range(min(k, n_accepted + 1, self.max_k)):
                kept = 1.0 if i < n_accepted else 0.0
                self.acc[i] = self.decay * self.acc[i] + kept
                self.tot[i] = self.decay * self.tot[i] + 1.0
        if self.fallback:
            if k == 0:
                self.plain_since_probe += 1
            if self.probing:
                self._probe_time += draft_time + verify_time
                self._probe_tokens += n_accepted + 1
                self.probing -= 1
                if not self.probing:
                    self._end_probe()

    # -- the model -------------------------------------------------------------
    def acceptance(self) -> list[float]:
        """Conditional acceptance by position.  A position never reached borrows
        the estimate of the one before it (the prior is only for position 1)."""
        out, prev = [], self.prior_accept
        for a, t in zip(self.acc, self.tot):
            prev = (a + prev * self.prior_weight) / (t + self.prior_weight)
            out.append(prev)
        return out

    def expected_tokens(self, k: int, accept: list[float] | None = None) -> float:
        accept = self.acceptance() if accept is None else accept
        e, run = 1.0, 1.0
        for a in accept[:k]:
            run *= a
            e += run
        return e

    def verify_model(self):
        """k -> predicted seconds of a target pass over k+1 positions (None before any
        pass was timed): the median of recent passes for a k seen, else a
        least-squares line through those medians (one k seen: +10 % per position)."""
        seen = {j: statistics.median(ts) for j, ts in self.verify_times.items() if ts}
        if not seen:
            return lambda k: None
        if len(seen) == 1:
            (j, t), = seen.items()
            base = t / (1 + self.verify_slope_prior * j)
            return lambda k: seen.get(k, base * (1 + self.verify_slope_prior * k))
        xs, ys = list(seen), list(seen.values())
        mx_, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx_) ** 2 for x in xs)
        slope = max(0.0, sum((x - mx_) * (y - my) for x, y in zip(xs, ys)) / sxx)
        floor = min(ys) * 0.5
        return lambda k: seen[k] if k in seen else max(floor, my + slope * (k - mx_))

    def verify_cost(self, k: int) -> float | None:
        return self.verify_model()(k)

    def draft_cost(self, k: int) -> float:
        if self.draft_steps:
            step = statistics.median(self.draft_steps)
        else:
            step = self.draft_cost_prior or 0.0
        return k * step

    def predicted_speeds(self) -> list[float]:
        """Expected tokens per second for k = 0..max_k (0.0 where nothing is measured)."""
        accept, verify = self.acceptance(), self.verify_model()
        speeds = []
        for k in range(self.max_k + 1):
            t = (verify(k) or 0.0) + self.draft_cost(k)
            speeds.append(self.expected_tokens(k, accept) / t if t > 0 else 0.0)
        return speeds

    def best(self) -> tuple[int, float]:
        """(the k >= 1 with the highest predicted speed, its predicted speed-up over k = 0)."""
        speeds = self.predicted_speeds()
        k = max(range(1, len(speeds)), key=lambda j: (speeds[j], -j))
        return k, (speeds[k] / speeds[0] if speeds[0] > 0 else 1.0)

    # -- fallback ----------------------------------------------------------------
    def _engage_fallback(self, speedup: float):
        self.fallback = True
        self.fallbacks += 1
        self.plain_since_probe = 0
        if self.probe_overhead is None:  # no probe timed yet: its drafting rounds, predicted
            verify = self.verify_model()
            self.probe_overhead = self.probe_rounds * max(
                0.0, self.draft_cost(1) + (verify(1) or 0.0) - (verify(0) or 0.0) * self.expected_tokens(1))
        self._set_wait()
        if self.stats is not None and not any(n.startswith("fallback") for n in self.stats.notes):
            a = self.acceptance()
            self.stats.notes.append(
                f"fallback after {self.stats.tokens_speculative + self.stats.tokens_plain} tokens: drafting "
                f"predicted to pay {speedup:.2f}x (acceptance at position 1 {a[0]:.2f}, draft step "
                f"{1000 * self.draft_cost(1):.1f} ms, plain step {1000 * (self.verify_cost(0) or 0):.1f} ms); "
                f"plain decoding, probing again after {self.probe_wait}+ tokens (doubling)")

    def _set_wait(self):
        """The backoff schedule, or longer when probes cost more than the budget allows."""
        v0 = self.verify_cost(0)
        budget_wait = self.probe_overhead / (self.probe_budget * v0) if v0 and self.probe_overhead else 0.0
        self.probe_wait = int(min(max(self.probe_every, budget_wait), self.max_probe_every))

    def _start_probe(self):
        self.probing = self.probe_rounds
        self.plain_since_probe = 0
        self._probe_time = self._probe_tokens = 0.0
        for i in range(self.max_k):  # forget half, so the probe's rounds count
            self.acc[i] *= 0.5
            self.tot[i] *= 0.5

    def _end_probe(self):
        v0 = self.verify_cost(0) or 0.0
        self.probe_overhead = max(0.0, self._probe_time - self._probe_tokens * v0)
        best, speedup = self.best()
        if speedup >= self.resume_above:
            self.fallback = False
            self.probe_every = self.probe_every0
            if self.stats is not None and not any(n.startswith("resumed") for n in self.stats.notes):
                self.stats.notes.append(f"resumed drafting after a probe: predicted {speedup:.2f}x at k={best}")
        else:
            self.probe_every = min(self.probe_every * 2, self.max_probe_every)
            self._set_wait()


VERIFY_SLOPE = 0.1  # a target pass over k+1 positions costs ~1 + 0.1k plain steps (OpenBLAS, Metal)


def make_adaptive(drafter, reproducible: bool = False) -> AdaptiveK:
    """The `--num-draft auto` policy for `drafter`.

    `reproducible=True` (a seeded sampling run) replaces measured timings by a
    fixed cost model -- the drafter's `relative_cost` per draft step and
    VERIFY_SLOPE per extra verified position -- so the k sequence depends only on
    acceptance, and the same seed gives the same output.  Greedy output never
    depends on k, so greedy runs keep the measured timings."""
    cost = (getattr(drafter, "relative_cost", 0.3), VERIFY_SLOPE) if reproducible else None
    return AdaptiveK(max_k=max(1, min(getattr(drafter, "max_k", 8) or 8, 8)), cost_model=cost)
