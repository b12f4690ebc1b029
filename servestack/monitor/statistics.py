"""The drift statistics of `servestack monitor`, on plain numpy arrays: one function per statistic.

Numbers: the population stability index over quantile bins of the baseline (`psi`), the first Wasserstein
distance between the two empirical distributions (`wasserstein`), and the share of values outside the
baseline's range. Categories: the chi-square test of homogeneity's p-value (`chi_square_p`) and the
Jensen-Shannon distance (`jensen_shannon`, base 2: 0 for equal distributions, 1 for disjoint ones).

Written with numpy alone, not scipy: scipy is no dependency of `servestack[cli]`, and what is needed is small
(a sort for Wasserstein, the regularized incomplete gamma function for the chi-square tail).
tests/unit/test_monitor_statistics.py checks each against scipy's own, which the development environment has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

PSI_BINS = 10
# A bin empty on one side would make the PSI infinite (ln 0): proportions are floored at this, as is usual.
PSI_FLOOR = 1e-4


def quantile_edges(baseline: np.ndarray, bins: int = PSI_BINS) -> np.ndarray:
    """The inner edges of `bins` bins holding equal shares of the baseline (fewer where values repeat): the
    outer bins are open, so every value of the current window falls in one. Each edge is a baseline value (no
    interpolation), so a column of few distinct values (a count, a flag) gets one bin per value."""
    if baseline.size == 0:
        return np.empty(0)
    inner = np.quantile(baseline, np.linspace(0.0, 1.0, bins + 1)[1:-1], method="inverted_cdf")
    return np.unique(inner)


def bin_shares(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The share of `values` in each bin: (-inf, e0], (e0, e1], ..., (e_last, inf)."""
    counts = np.bincount(np.searchsorted(edges, values, side="left"), minlength=edges.size + 1)
    return counts / max(values.size, 1)


def psi(baseline: np.ndarray, current: np.ndarray, bins: int = PSI_BINS) -> float:
    """Population stability index: sum over the baseline's quantile bins of (c - b) * ln(c / b). Under 0.1 is
    usually read as stable, 0.1-0.2 as a moderate shift, over 0.2 as a significant one."""
    if baseline.size == 0 or current.size == 0:
        return 0.0
    edges = quantile_edges(baseline, bins)
    expected = np.maximum(bin_shares(baseline, edges), PSI_FLOOR)
    actual = np.maximum(bin_shares(current, edges), PSI_FLOOR)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def wasserstein(baseline: np.ndarray, current: np.ndarray) -> float:
    """The first Wasserstein (earth mover's) distance between two samples: the area between their empirical
    cumulative distribution functions, in the values' own unit."""
    if baseline.size == 0 or current.size == 0:
        return 0.0
    a, b = np.sort(baseline), np.sort(current)
    points = np.sort(np.concatenate([a, b]))
    widths = np.diff(points)
    cdf_a = np.searchsorted(a, points[:-1], side="right") / a.size
    cdf_b = np.searchsorted(b, points[:-1], side="right") / b.size
    return float(np.sum(np.abs(cdf_a - cdf_b) * widths))


def out_of_range_share(baseline: np.ndarray, current: np.ndarray) -> float:
    """The share of current values below the baseline's minimum or above its maximum."""
    if baseline.size == 0 or current.size == 0:
        return 0.0
    low, high = float(np.min(baseline)), float(np.max(baseline))
    return float(np.mean((current < low) | (current > high)))


# ------------------------------------------------------------------------------------------ categories


def shares(counts: Mapping[str, int], categories: list[str]) -> np.ndarray:
    total = sum(counts.values())
    return np.array([counts.get(name, 0) for name in categories], dtype=np.float64) / max(total, 1)


def jensen_shannon(baseline: Mapping[str, int], current: Mapping[str, int]) -> float:
    """The Jensen-Shannon distance (the square root of the divergence, in bits) between two distributions of
    category counts: 0 when equal, 1 when they share no category."""
    categories = sorted(set(baseline) | set(current))
    if not categories or not sum(baseline.values()) or not sum(current.values()):
        return 0.0
    p, q = shares(baseline, categories), shares(current, categories)
    middle = (p + q) / 2

    def divergence(x: np.ndarray) -> float:
        held = x > 0
        return float(np.sum(x[held] * np.log2(x[held] / middle[held])))

    return math.sqrt(max((divergence(p) + divergence(q)) / 2, 0.0))


def chi_square_p(baseline: Mapping[str, int], current: Mapping[str, int]) -> float:
    """The p-value of the chi-square test that both samples come from one distribution of categories (a 2 x k
    contingency table, k - 1 degrees of freedom). Tiny differences are significant on large samples: read it
    with the Jensen-Shannon distance, which says how large the difference is."""
    categories = sorted(name for name in set(baseline) | set(current) if baseline.get(name, 0) + current.get(name, 0))
    if len(categories) < 2 or not sum(baseline.values()) or not sum(current.values()):
        return 1.0
    table = np.array([[counts.get(name, 0) for name in categories] for counts in (baseline, current)], dtype=float)
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(np.sum((table - expected) ** 2 / expected))
    return chi_square_survival(statistic, len(categories) - 1)


def chi_square_survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X chi-square with `dof` degrees of freedom: Q(dof / 2, statistic / 2), the
    regularized upper incomplete gamma function."""
    half = statistic / 2.0
    if half <= 0:  # the smallest positive float halves to 0
        return 1.0
    return _upper_gamma(dof / 2.0, half)


def _upper_gamma(a: float, x: float) -> float:
    """Q(a, x) by its series below a + 1 and by its continued fraction (modified Lentz) above, as in Numerical
    Recipes' `gammq`: each converges fast on its side, to double precision within 300 steps for the degrees of
    freedom a monitored column has."""
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        denominator = a
        for _ in range(1000):
            denominator += 1
            term *= x / denominator
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    fraction = d
    for step in range(1, 1000):
        an = -step * (step - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        fraction *= delta
        if abs(delta - 1) < 1e-16:
            break
    return min(1.0, math.exp(log_prefix) * fraction)
