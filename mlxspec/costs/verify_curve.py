"""Verify costs that never fall with width, where the products cannot make them fall.

A calibration times verify passes by width (costs/cost_model.py), and on a shared machine
single widths come out noisy: three calibrations of one machine priced a pass over 3
positions at 1.00, 1.18 and 1.03 plain steps, the first below a pass over 2 (1.08).  Read as
measured, such a dip is a price: `CostModel.pad_width` pads 2-position passes to 3
(the verify pass, and a tree level's draft forward too), and the tree budget treats
the third position as free and spends it on a sibling where a chain goes deeper.

With the small-batch kernel (cpu/small_gemm.c) a dip cannot be real: it streams each
weight once whatever the number of rows and adds each row's multiply-adds, and the
attention adds work per position, so a wider pass does strictly more.  There the
verify curve is made non-decreasing by isotonic regression (pool adjacent violators:
each run of widths that falls is replaced by its mean, the least-squares fit among
non-decreasing curves), and nothing is padded.  The calibration file keeps the
figures as measured.  Without the kernel (OpenBLAS, whose 16-row products can cost
less than 5- to 15-row ones) a dip can be real and the curve is used as measured.

On Metal a dip can be real too (MLX switches GEMM kernels by shape), but a single lucky or
unlucky pass makes false ones, and there is no /proc load figure to tell them apart: a
calibration there takes the minimum of its synchronised repeats per width, and a dip counts
only where it reproduces (`dips_reproduce`: every timing of the wider pass beats the narrower
pass's median); otherwise the curve is used made monotone, as with the kernel.

Priced by `benchmarks/priced_rounds.py`'s method on the EPYC's cached calibration
(2 / 3 positions at 1.08 / 1.00), and by two later calibrations of the same machine as
other truths, deciding by the monotone curve raised greedy trees by 1.7-2.0 % on the code
suite, 5.5-6.7 % on chat and 0.6-1.5 % on creative (README, "Verify costs that never fall").
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median

SPREAD_WARN = 1.3  # Metal: repeats of one width typically this far apart (slowest / fastest): say so


def isotonic(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (equal weights): pool adjacent violators."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    out: list[float] = []
    for s, n in blocks:
        out += [round(s / n, 4)] * int(n)
    return out


def monotone(cm):
    """`cm` with its verify curve non-decreasing (its first entry stays 1.0: every cost
    is relative to a plain step, so a pooled run that starts at width 1 is pooled from
    width 2 on)."""
    v = list(cm.verify)
    if all(b >= a for a, b in zip(v, v[1:])):
        return cm
    fitted = [1.0] + [max(1.0, x) for x in isotonic(v[1:])]
    return replace(cm, verify=fitted, monotone=True)


def kernel_is_monotone() -> bool:
    """Whether verify passes run on the small-batch kernel, where a dip is noise."""
    from .. import cpu

    return cpu.kernel_in_use()


def dips_reproduce(times: dict) -> bool:
    """Whether every dip of the verify curve by minimum ({width: [seconds, ...]}) was measured
    repeatedly: wherever a wider pass's fastest timing beats a narrower one's, every timing of
    the wider pass beats the narrower's median.  True when there is no dip."""
    ws = sorted(w for w in times if times[w])
    for i, w in enumerate(ws):
        for v in ws[:i]:
            if min(times[w]) < min(times[v]) and not max(times[w]) < median(times[v]):
                return False
    return True


def repeat_spread(times: dict) -> float:
    """How widely repeats of one call spread: the median over the timed keys of slowest /
    fastest (1.0: every repeat alike)."""
    ratios = [max(v) / min(v) for v in times.values() if len(v) > 1 and min(v) > 0]
    return median(ratios) if ratios else 1.0


def spread_warning(cm) -> str | None:
    """One line when a Metal calibration's repeats spread widely (None otherwise)."""
    if cm.spread is None or cm.spread <= SPREAD_WARN:
        return None
    return (f"note: the calibration's repeats spread widely (slowest {cm.spread:.2f}x the fastest): other work "
            "was likely running; `mlxspec calibrate` again when the machine is quiet")


def as_used(cm, gpu: bool | None = None):
    """The cost model the rules decide by: monotone where a dip cannot be real (the
    small-batch kernel), or, on Metal (`gpu`, default: the backend in use), where the dip
    did not reproduce across repeats (or was not judged: a calibration cached without it)."""
    if kernel_is_monotone():
        return monotone(cm)
    if gpu is None:
        from ..device import is_gpu

        gpu = is_gpu()
    if gpu and cm.dips_real is not True:
        return monotone(cm)
    return cm
