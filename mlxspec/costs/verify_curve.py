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
less than 5- to 15-row ones; Metal) a dip can be real and the curve is used as measured.

Priced by `benchmarks/priced_rounds.py`'s method on the EPYC's cached calibration
(2 / 3 positions at 1.08 / 1.00), and by two later calibrations of the same machine as
other truths, deciding by the monotone curve raised greedy trees by 1.7-2.0 % on the code
suite, 5.5-6.7 % on chat and 0.6-1.5 % on creative (README, "Verify costs that never fall").
"""

from __future__ import annotations

from dataclasses import replace


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


def as_used(cm):
    """The cost model the rules decide by: monotone where a dip cannot be real."""
    return monotone(cm) if kernel_is_monotone() else cm
