"""Chi-square goodness of fit without scipy."""

import math


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df), via the Wilson-Hilferty cube-root normal
    approximation (good to a few 1e-3 for df >= 10, plenty for pass/fail at 1e-3)."""
    if df <= 0:
        return 1.0
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def chi_square(observed: dict, expected_probs: dict, n: int, min_expected: float = 5.0):
    """Pool outcomes with expected count < min_expected into one bin.  Returns (stat, df, p)."""
    stat, bins, pooled_o, pooled_e = 0.0, 0, 0, 0.0
    for key, p in expected_probs.items():
        e = p * n
        o = observed.get(key, 0)
        if e < min_expected:
            pooled_o += o
            pooled_e += e
            continue
        stat += (o - e) ** 2 / e
        bins += 1
    unexpected = sum(o for k, o in observed.items() if k not in expected_probs)
    pooled_o += unexpected
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        bins += 1
    elif pooled_o:
        return math.inf, bins, 0.0
    df = bins - 1
    return stat, df, chi2_sf(stat, df)
