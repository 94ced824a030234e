"""The pair's cost model: what a draft step and a verify pass cost on this machine.

All costs are relative to one plain target step (a target forward over one
position, plus the argmax/log-softmax of a decoding step):

* `draft_step`: one step of the drafter (its forward, head and sampling);
* `verify[w - 1]`: one target pass over exactly w positions (`verify[0]` is 1);
* `draft_widths[w - 1]`: a draft forward over w positions (a token tree's level,
  trees/budget.py) against one over a single position (`draft_widths[0]` is 1).
  The draft's curve is its own: an int8 draft (cpu/draft_weights.py) is compute-bound
  at fewer positions than a 16-bit target (measured here: a draft forward over 5
  / 7 positions 1.65x / 1.72x one over a single position, a target pass 1.26x /
  1.31x).  Without it (a calibration from before, a drafter without a model) the
  target's curve stands in.

A wider pass can cost less than a narrower one: Debian's OpenBLAS 0.3.21 runs a
16-row product faster than a 5- to 15-row one (measured here: 16 positions cost
1.57 plain steps of the default target, 5 cost 1.65, 12 cost 2.67).  So a pass
over w positions is run padded to `pad_width(w)`, the width at or above w that
costs least, and `verify_width(w)` is what that padded pass costs: never less
for more positions.  Where wider is never cheaper (Metal, other BLAS) nothing
is padded.

The draft-length policy (costs/draft_length.py) decides from these numbers and the
acceptance it observes -- never from wall-clock timings taken in the hot path,
which on a shared machine are noise (and would make seeded runs irreproducible).

`calibrate` measures them once in a minute or two (after a warm-up, in sweeps that
time every width once, round-robin; the median over repeats, with several sweeps
per repeat for the plain step, the draft step and passes up to SAMPLED_WIDTH
positions, which everything is relative to or turns on, and two for wider ones) and
`calibration_cache.for_decoder` caches the result under the mlxspec home, keyed by
machine, backend and pair, so
`generate`, `chat`, `Session` and `bench` reuse it; `mlxspec calibrate`
re-measures and prints it.  Figures are rounded to two decimals so that a
re-measurement that differs only by noise leaves seeded output unchanged.
"""

from __future__ import annotations

import time
from statistics import median
from dataclasses import asdict, dataclass, field

FORMAT = 7  # 7: every verify width up to TIMED_UP_TO timed, wide ones WIDE_SAMPLES times per repeat; 6: passes
# up to SAMPLED_WIDTH timed SAMPLES times per repeat, round-robin; 5: the draft's forwards by width; 4: plain and
# draft steps timed SAMPLES times per repeat
TIMED_UP_TO = 17  # every verify width up to here is timed, none interpolated: the small kernel (cpu/small_gemm.c) runs
# a pass in register tiles of at most 6 rows on AVX2 (10 on AVX-512), so its cost climbs in steps, not a line
# (AVX2 EPYC: 6 / 7 positions 1.86 / 2.44 plain steps, 12 / 13 2.73 / 3.52); timed at 1, 2, 3, 4, 6, 8, 12 and 16
# and interpolated, 7 and 13 were priced 2.14 and 2.96, and token trees grew to 13 positions where 12 cost less
WIDTHS = tuple(range(1, TIMED_UP_TO + 1)) + (24, 32)  # verify widths measured; wider ones are interpolated linearly
DRAFT_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)  # draft forward widths measured (a tree level: at most MAX_BRANCH
# x a level; 5 and 7 for the same steps when the draft's products are the float16 kernel's)
ASSUMED_VERIFY_SLOPE = 0.1  # before calibration: +10 % per extra verified position (OpenBLAS, Metal)
REPEATS = 3  # timed repeats after one warm-up pass; the median counts (a minimum is a lucky pass)
SAMPLES = 3  # timings per repeat of a plain step and of the draft: every cost is relative to the one and
# the draft's to both, and a single timing of a short call on a shared machine is noise (0.21-0.35 plain steps)
SAMPLED_WIDTH = 8  # verify passes up to this width are timed SAMPLES times per repeat too: the median of three
# single timings priced a pass over 2 positions at 1.05-1.13 plain steps in runs minutes apart (in the loop: 1.04),
# and whether a sibling pays turns on the step from 2 to 3 positions (1.04 -> 1.20); wider passes are dearer and rarer
WIDE_SAMPLES = 2  # ... and wider ones this many times: once per repeat, an AVX2 EPYC priced passes over 9 to 13
# positions at 3.03, 2.83, 3.19, 3.44 and 3.11 plain steps (a spell of load only ever makes a pass slower)
PAD_MIN_SAVING = 0.05  # pad a pass to a wider width only if that saves this much of a plain step (not noise)


@dataclass
class CostModel:
    draft_step: float
    verify: list = field(default_factory=lambda: [1.0])  # verify[w-1]: pass over w positions
    plain_step_s: float = 0.0  # seconds of one plain target step, for display only
    source: str = "assumed"  # assumed | measured | cached
    draft_widths: list = field(default_factory=list)  # draft_widths[w-1]: a draft forward over w positions / over 1
    busy: float | None = None  # measured: the cores other programs kept busy meanwhile (costs/machine_load.py)
    monotone: bool = False  # the verify curve as measured fell somewhere and was made non-decreasing (costs/verify_curve.py)
    dips_real: bool | None = None  # Metal: every dip of the verify curve reproduced across repeats (None: not judged)
    spread: float | None = None  # Metal: the widest (slowest / fastest) spread of one width's repeats

    def pad_width(self, w: int) -> int:
        """The width to run a pass over w >= 1 positions at: w, or a wider width of
        the table that costs at least PAD_MIN_SAVING less."""
        v, best = self.verify, w
        if w > len(v):
            return w
        for x in range(w + 1, len(v) + 1):
            if v[x - 1] < v[best - 1] and v[x - 1] <= v[w - 1] - PAD_MIN_SAVING:
                best = x
        return best

    def verify_width(self, w: int) -> float:
        """Cost of a target pass over w >= 1 positions: the least a pass at w or wider
        costs (it runs at `pad_width(w)`, within PAD_MIN_SAVING of that); linear
        beyond the table."""
        v = self.verify
        if w <= len(v):
            return min(v[w - 1:])
        slope = (v[-1] - v[0]) / (len(v) - 1) if len(v) > 1 else ASSUMED_VERIFY_SLOPE
        return max(v[-1], v[-1] + slope * (w - len(v)))

    def draft_curve(self, w: int) -> float:
        """A draft forward over w >= 1 positions against one over a single position: the
        draft's own curve (linear beyond the table), or the verify curve where it was
        not measured."""
        d = self.draft_widths
        if not d:
            return self.verify_width(w)
        if w <= len(d):
            return d[w - 1]
        slope = (d[-1] - d[0]) / (len(d) - 1) if len(d) > 1 else ASSUMED_VERIFY_SLOPE
        return d[-1] + slope * (w - len(d))

    def draft_width(self, w: int) -> float:
        """Cost in plain steps of a draft forward over w >= 1 positions."""
        return self.draft_step * self.draft_curve(w)

    def extra(self, w: int) -> float:
        """Marginal cost of verifying w positions instead of w - 1."""
        return max(0.0, self.verify_width(w) - self.verify_width(w - 1))

    def to_dict(self) -> dict:
        return asdict(self)

    def describe_width(self, w: int) -> str:
        """'w: cost', with the width the pass is padded to when it is."""
        padded = self.pad_width(w)
        return f"{w}: {self.verify_width(w):.2f}" + (f" (as {padded})" if padded != w else "")

    def describe(self) -> str:
        v = ", ".join(self.describe_width(w) for w in (2, 5, 9, 17))
        step = f"plain step {1000 * self.plain_step_s:.1f} ms, " if self.plain_step_s else ""
        d = ", ".join(f"{w}: {self.draft_widths[w - 1]:.2f}" for w in (2, 4, 8) if w <= len(self.draft_widths))
        d = f", draft forward by width {{{d}}}" if d else ""
        made = ", made monotone" if self.monotone else ""
        return f"{step}draft step {self.draft_step:.2f}, verify by width {{{v}}}{d} ({self.source}{made})"


MERGE_MAX_EXTRA = 0.5  # re-fed positions ride along in a verify pass while they add at most half a plain step


def merge_limit(cm: CostModel) -> int:
    """How many re-fed positions (core/recurrent.py) may ride along in a verify pass before
    they get a call of their own: while they add at most MERGE_MAX_EXTRA."""
    return max((r for r in range(17) if cm.verify_width(1 + r) - 1 <= MERGE_MAX_EXTRA), default=0)


def refeed_cost(cm: CostModel, n: float, width: int = 1) -> float:
    """What re-feeding n positions after a rejection costs a recurrent target: the
    extra width of the pass over `width` new positions they ride along in, or, beyond
    `merge_limit`, a call of their own.  A fractional n (an expected count) interpolates."""
    lo = int(n)
    if n > lo:
        return (lo + 1 - n) * refeed_cost(cm, lo, width) + (n - lo) * refeed_cost(cm, lo + 1, width)
    if lo <= 0:
        return 0.0
    return cm.verify_width(width + lo) - cm.verify_width(width) if lo <= merge_limit(cm) else cm.verify_width(lo)


def refeed_chain(cm: CostModel, acceptance: float, k: int) -> list[float]:
    """The long-run share of verify passes that carry r = 0, 1, ... re-fed positions
    (index r), for rounds of k drafts each kept with probability a (independently).

    core/recurrent.py's mechanism: a round rejected after j kept drafts rolls back to the
    checkpoint before its pass, so the next pass re-feeds what this one re-fed (b)
    plus j + 1: r' = b + j + 1, where b = r while r <= L = merge_limit (the re-fed
    positions rode along, no checkpoint after them) and b = 0 when r > L (they got a
    call of their own and a checkpoint).  A fully accepted round leaves r' = 0.
    Back-to-back rejections so pile up, up to L + k.  Solved exactly: with
    q_j = a^j (1 - a) and beta(b) the share of passes whose rejection piles onto b,
    pi(0) = a^k and pi(s) = sum_j q_j beta(s - j - 1); beta(b) = pi(b) for 1 <= b <= L
    is linear in beta(0), fixed by the betas summing to 1."""
    a, lim = acceptance, merge_limit(cm)
    if k <= 0 or a >= 1:
        return [1.0]
    q = [a ** j * (1 - a) for j in range(k)]
    u = [1.0]  # beta(b) / beta(0)
    for s in range(1, lim + 1):
        u.append(sum(q[j] * u[s - j - 1] for j in range(min(k, s))))
    beta = [x / sum(u) for x in u]
    pi = [a ** k] + [0.0] * (lim + k)
    for b, mass in enumerate(beta):
        for j in range(k):
            pi[b + j + 1] += q[j] * mass
    return pi


def expected_refed(cm: CostModel, acceptance: float, k: int) -> float:
    """Re-fed positions per verify pass in the long run (stats: refed_positions / target_passes)."""
    return sum(r * p for r, p in enumerate(refeed_chain(cm, acceptance, k)))


def expected_riding(cm: CostModel, acceptance: float, k: int) -> float:
    """Re-fed positions riding along in a pass in the long run: what a rejection in
    that pass re-feeds once more, on top of its own kept tokens."""
    lim = merge_limit(cm)
    return sum(r * p for r, p in enumerate(refeed_chain(cm, acceptance, k)) if r <= lim)


def predicted_speedup(cm: CostModel, acceptance: float, k: int, refeed: bool = False) -> float:
    """Speed-up over plain decoding of rounds of k drafts, each kept with probability
    `acceptance` (independently), per this cost model.  `refeed`: a recurrent target
    re-feeds rejected rounds' kept positions (core/recurrent.py), r of them in a pass with
    the long-run shares of `refeed_chain`: riding along, the pass is r positions
    wider; beyond `merge_limit`, they are a call of their own."""
    a = acceptance
    tokens = sum(a ** i for i in range(k + 1))
    time = k * cm.draft_step + cm.verify_width(k + 1)
    if refeed:
        time += sum(p * refeed_cost(cm, r, k + 1) for r, p in enumerate(refeed_chain(cm, a, k)))
    return tokens / time


def assumed(relative_cost: float, slope: float = ASSUMED_VERIFY_SLOPE, width: int = 17) -> CostModel:
    """A cost model from a guess: the drafter's own estimate of its relative cost."""
    return CostModel(round(relative_cost, 2), [round(1 + slope * (w - 1), 2) for w in range(1, width + 1)])


def _fill(widths: dict[int, float], max_width: int) -> list[float]:
    """Relative costs for w = 1..max_width from measured widths: linear in between.
    A wider pass measured cheaper stays cheaper (CostModel.pad_width uses it)."""
    ws = sorted(widths)
    out = []
    for w in range(1, max_width + 1):
        lo = max([x for x in ws if x <= w], default=ws[0])
        hi = min([x for x in ws if x >= w], default=ws[-1])
        t = widths[lo] if hi == lo else widths[lo] + (widths[hi] - widths[lo]) * (w - lo) / (hi - lo)
        out.append(max(t, 1.0))  # never below one position (a plain step is never padded)
    return out


def calibrate(target_model, drafter, vocab_size: int, *, widths=WIDTHS, repeats: int = REPEATS,
              context: int = 64) -> CostModel:
    """Measure the drafter's step and the target's verify passes by width on a
    synthetic context of `context` tokens.  The drafter is timed through its own
    `propose` (4 tokens, greedy, no early stop), so its real per-step overheads count."""
    import mlx.core as mx

    from ..core.cache import ModelState
    from ..core.sampling import SamplingParams
    from ..device import is_gpu

    subset = getattr(getattr(drafter, "model", drafter), "subset", None)  # a pruned head (hybrid: its model's)
    pool = subset.ids.tolist() if subset is not None else range(1, max(vocab_size, 2))
    # ids the pruned head already scores, so that its prefill does not widen it with synthetic tokens
    ids = [pool[(7919 * i + 13) % len(pool)] for i in range(context + max(widths))]
    history = ids[:context]
    target = ModelState(target_model)
    target.prefill(history)
    greedy = SamplingParams()
    k_draft = 4 if getattr(drafter, "uses_draft_model", False) else 0
    if k_draft:
        drafter.reset()
        drafter.prefill(history)

    def draft_once():
        drafter.propose(history, k_draft, greedy, None)

    draft_state = _draft_state(drafter) if k_draft else None
    times: dict = {w: [] for w in widths}
    times["draft"] = []
    times.update({f"draft@{w}": [] for w in (DRAFT_WIDTHS if draft_state is not None else ())})

    gpu = is_gpu()
    sync = getattr(mx, "synchronize", None) if gpu else None

    def timed(key, call, per: int = 1, keep: bool = True) -> None:
        """Time `call` once into times[key] (seconds / `per`; a warm-up keeps none).  On
        Metal the queue is drained before and after, so a pass is timed whole and alone."""
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        call()
        if sync is not None:
            sync()
        if keep:
            times[key].append((time.perf_counter() - t0) / per)

    # Round-robin: each sweep times every width once, so a spell of load on a shared
    # machine weighs on all of them alike (timing one width several times in a row
    # priced a 2-position draft forward at 1.00-1.14 of one position in runs minutes apart)
    for rep in range(repeats + 1):
        for sweep in range(SAMPLES if rep else 1):  # the warm-up makes every call once
            for w in widths:
                if w <= SAMPLED_WIDTH or sweep < WIDE_SAMPLES:
                    timed(w, lambda: width_pass(target, history, w, ids[context:]), keep=rep > 0)
            if k_draft:
                timed("draft", draft_once, per=k_draft, keep=rep > 0)
            for w in DRAFT_WIDTHS if draft_state is not None else ():
                # a draft forward is short: single timings are noise (27-39 ms at one width)
                timed(f"draft@{w}", lambda: width_pass(draft_state, history, w, ids[context:]), keep=rep > 0)
    target.reset()
    if k_draft:
        drafter.reset()
    if not k_draft:
        del times["draft"]
    rc = getattr(drafter, "relative_cost", 0.0)
    return from_times(times, rc, metal=True) if gpu else from_times(times, rc)


def width_pass(state, history: list[int], width: int, fill: list[int]) -> None:
    """One pass of `state` (core/cache.ModelState) over `width` positions after `history`:
    what its cache lacks of `history`, then tokens of `fill`, its argmax evaluated (the
    pass calibrate times; benchmarks/loop_price.py times it at a loop's own contexts)."""
    import mlx.core as mx

    pending = state.sync(history)
    mx.eval(mx.argmax(state.forward(pending + fill[: width - len(pending)]), axis=-1))


def _draft_state(drafter):
    """The ModelState of the drafter's model (a hybrid drafter's model part), or None."""
    from ..core.cache import ModelState

    for d in (drafter, getattr(drafter, "model", None)):
        if isinstance(getattr(d, "state", None), ModelState):
            return d.state
    return None


def from_times(times: dict, relative_cost: float = 0.0, *, metal: bool = False) -> CostModel:
    """The cost model from timed repeats: {width: [seconds, ...], "draft": [seconds per step, ...],
    "draft@w": [seconds of a draft forward over w positions, ...]} (no "draft": the drafter's
    own `relative_cost`).  Medians, relative to the one-position pass (each model's own).

    `metal`: the minimum of the repeats instead (synchronised GPU passes are only ever
    slowed, by the window server, the display or another app's work, never sped up), and
    the model records whether every dip of the verify curve reproduced across repeats
    (`dips_real`, costs/verify_curve.py: otherwise the rules use the curve made monotone)
    and how widely the repeats spread (`spread`)."""
    from .verify_curve import dips_reproduce, repeat_spread

    pick = min if metal else median
    widths = [w for w in times if isinstance(w, int)]
    plain = pick(times[1])
    rel = {w: pick(times[w]) / plain for w in widths}
    draft = pick(times["draft"]) / plain if "draft" in times else relative_cost
    verify = [round(v, 2) for v in _fill(rel, max(widths))]
    verify[0] = 1.0
    drafts = {int(k.split("@")[1]): pick(v) for k, v in times.items() if isinstance(k, str) and "@" in k}
    draft_widths = []
    if 1 in drafts:
        draft_widths = [round(v, 2) for v in _fill({w: t / drafts[1] for w, t in drafts.items()}, max(drafts))]
        draft_widths[0] = 1.0
    cm = CostModel(round(draft, 2), verify, plain, "measured", draft_widths)
    if metal:
        cm.dips_real = dips_reproduce({w: times[w] for w in widths})
        cm.spread = round(repeat_spread(times), 2)
    return cm
