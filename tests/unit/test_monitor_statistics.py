"""The monitor's statistics (servestack/monitor/statistics.py, numpy only) against scipy's, and on distributions
whose answer is known; the drift verdict of a column (servestack/monitor/drift.py) on the cases it must tell apart."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.spatial.distance import jensenshannon

from servestack.monitor import statistics
from servestack.monitor.drift import Thresholds, category, compare

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=1, max_size=60).map(np.array)
counts = st.dictionaries(st.sampled_from("abcdefg"), st.integers(0, 500), min_size=1).filter(lambda c: sum(c.values()))


@settings(max_examples=200, deadline=None)
@given(samples, samples)
def test_wasserstein_equals_scipys(a: np.ndarray, b: np.ndarray) -> None:
    assert statistics.wasserstein(a, b) == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-9, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(counts, counts)
def test_jensen_shannon_equals_scipys(a: dict[str, int], b: dict[str, int]) -> None:
    names = sorted(set(a) | set(b))
    expected = jensenshannon(statistics.shares(a, names), statistics.shares(b, names), base=2)
    assert statistics.jensen_shannon(a, b) == pytest.approx(expected, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(counts, counts)
def test_chi_square_p_equals_scipys_contingency_test(a: dict[str, int], b: dict[str, int]) -> None:
    names = [name for name in sorted(set(a) | set(b)) if a.get(name, 0) + b.get(name, 0)]
    if len(names) < 2:
        assert statistics.chi_square_p(a, b) == 1.0
        return
    table = np.array([[side.get(name, 0) for name in names] for side in (a, b)])
    expected = stats.chi2_contingency(table, correction=False).pvalue
    assert statistics.chi_square_p(a, b) == pytest.approx(expected, rel=1e-7, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 2000, allow_nan=False), st.integers(1, 200))
def test_the_chi_square_tail_equals_scipys(statistic: float, dof: int) -> None:
    assert statistics.chi_square_survival(statistic, dof) == pytest.approx(
        stats.chi2.sf(statistic, dof), rel=1e-9, abs=1e-300
    )


def test_psi_is_zero_for_one_distribution_and_large_for_a_shift() -> None:
    rng = np.random.default_rng(0)
    baseline = rng.normal(size=20_000)
    # GIVEN samples of the same normal distribution THEN the PSI is far under the usual 0.1 of "stable"
    assert statistics.psi(baseline, rng.normal(size=20_000)) < 0.01
    assert statistics.psi(baseline, baseline) == 0.0
    # AND a shift of one standard deviation is past 0.2 ("significant"), half of one in between
    assert statistics.psi(baseline, rng.normal(1.0, size=20_000)) > 0.2
    assert 0.1 < statistics.psi(baseline, rng.normal(0.5, size=20_000)) < 0.4


def test_psi_bins_are_the_baselines_deciles_and_catch_every_value() -> None:
    baseline = np.arange(1000, dtype=float)
    edges = statistics.quantile_edges(baseline)
    assert len(edges) == 9
    shares = statistics.bin_shares(baseline, edges)
    assert shares == pytest.approx(np.full(10, 0.1), abs=0.002)
    # values past either end fall in the open outer bins
    assert statistics.bin_shares(np.array([-1e9, 1e9]), edges).tolist() == [0.5] + [0.0] * 8 + [0.5]
    # a column of few distinct values gets one bin per value, its edges the values themselves
    flags = np.array([0.0, 1.0] * 50)
    assert statistics.quantile_edges(flags).tolist() == [0.0, 1.0]
    assert statistics.bin_shares(flags, statistics.quantile_edges(flags)).tolist() == [0.5, 0.5, 0.0]


def test_wasserstein_of_a_shift_is_the_shift() -> None:
    values = np.linspace(0, 1, 101)
    assert statistics.wasserstein(values, values + 3.0) == pytest.approx(3.0)


def test_out_of_range_share() -> None:
    assert statistics.out_of_range_share(np.array([0.0, 10.0]), np.array([-1.0, 5.0, 11.0, 10.0])) == 0.5


def test_jensen_shannon_bounds() -> None:
    assert statistics.jensen_shannon({"a": 5, "b": 5}, {"a": 50, "b": 50}) == 0.0
    assert statistics.jensen_shannon({"a": 5}, {"b": 5}) == pytest.approx(1.0)


def column(kind: str, baseline: list[object], current: list[object]) -> list[str]:
    dtype = object if kind == "categorical" else float
    limits = Thresholds()
    return compare("c", kind, np.array(baseline, dtype=dtype), np.array(current, dtype=dtype), limits).flags  # type: ignore[arg-type]


def test_a_column_is_flagged_for_each_reason_and_only_for_it() -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(size=2000).tolist()
    assert column("numeric", base, rng.normal(size=2000).tolist()) == []
    shifted = column("numeric", base, rng.normal(3.0, size=2000).tolist())
    assert [flag.split()[0] for flag in shifted] == ["PSI", f"{shifted[1].split()[0]}"]
    assert "outside the baseline's range" in shifted[1]
    # missing values: counted apart, flagged when their rate rises past the threshold
    holes = rng.normal(size=2000).tolist()
    holes[:300] = [float("nan")] * 300
    flags = column("numeric", base, holes)
    assert len(flags) == 1
    assert flags[0].startswith("missing rate 15.0% (baseline 0.0%)")
    # categories: an unseen one at 1.5% is flagged for being unseen, not (yet) for the distance
    sites = ["north", "south", "east"] * 700
    assert column("categorical", sites, sites) == []
    unseen = column("categorical", sites, sites[:-30] + ["west"] * 30)
    assert len(unseen) == 1
    assert unseen[0].startswith("1.4% of values in unseen categories ('west')")
    # a balance that moves is flagged by its distance
    moved = column("categorical", sites, ["north"] * 1800 + ["south"] * 200 + ["east"] * 100)
    assert len(moved) == 1
    assert moved[0].startswith("Jensen-Shannon distance")


def test_categories_are_named_as_json_writes_them() -> None:
    assert [category(v) for v in ("a", True, np.bool_(False), 3, 3.0, 2.5, np.int64(7))] == [
        "a",
        "true",
        "false",
        "3",
        "3",
        "2.5",
        "7",
    ]
    assert Counter(map(category, np.array(["x", "x", "y"], dtype=object))) == {"x": 2, "y": 1}
