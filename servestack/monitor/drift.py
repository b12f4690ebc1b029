"""Column against column: the statistics of servestack/monitor/statistics.py for one column of the baseline and
of the current window, the thresholds that flag it, and the whole comparison as the JSON summary holds it.

A column is numeric (float and integer columns, a regressor's predictions, a classifier's confidence) or
categorical (strings, booleans, a classifier's predicted classes: the class balance). Its values arrive as a
1-D array; a numeric column's missing values are NaN, counted apart and left out of the distribution.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from servestack.monitor import statistics

Kind = Literal["numeric", "categorical"]
MOST_UNSEEN = 10  # unseen categories listed by name, the most frequent first
HISTOGRAM_BINS = 20  # the report's bins of a numeric column
MOST_SHARES = 50  # categories whose shares the summary keeps per side: an id-like column has thousands


@dataclass(frozen=True)
class Thresholds:
    """Past any of these a column counts as drifted (`servestack monitor --max-psi ...` overrides each)."""

    psi: float = 0.2  # numeric: population stability index
    js: float = 0.1  # categorical: Jensen-Shannon distance
    unseen: float = 0.01  # categorical: share of current values in a category the baseline never had
    out_of_range: float = 0.05  # numeric: share of current values outside the baseline's [min, max]
    missing: float = 0.05  # both: rise of the missing rate over the baseline's, in points of share


@dataclass(frozen=True)
class ColumnDrift:
    """One column compared. `statistics`: name -> value (psi, wasserstein, ... or js, chi_square_p, ...);
    `flags`: why it counts as drifted, one phrase per threshold passed (empty: it does not)."""

    name: str
    kind: Kind
    baseline_rows: int
    current_rows: int
    baseline_missing: float
    current_missing: float
    statistics: dict[str, float]
    flags: list[str]
    unseen: dict[str, int] = field(default_factory=dict)  # categorical: the unseen categories and their counts
    # What the plot and the table show: numeric: min, max, mean of each side; categorical: the shares by category.
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def drifted(self) -> bool:
        return bool(self.flags)


def missing_mask(values: np.ndarray) -> np.ndarray:
    """Which values are missing: NaN in a float column, None in an object column."""
    if values.dtype.kind == "f":
        return np.asarray(np.isnan(values), dtype=bool)
    if values.dtype.kind == "O":
        # dtype given: a column left out of every record (personal data) is an empty array, still a mask
        return np.array(
            [value is None or (isinstance(value, float) and value != value) for value in values], dtype=bool
        )
    return np.zeros(values.shape, dtype=bool)


def _missing_rate(values: np.ndarray, missing: np.ndarray) -> float:
    return float(missing.mean()) if values.size else 0.0


def compare(name: str, kind: Kind, baseline: np.ndarray, current: np.ndarray, limits: Thresholds) -> ColumnDrift:
    """One column of the baseline against the same column of the current window."""
    base_missing, current_missing = missing_mask(baseline), missing_mask(current)
    rates = (_missing_rate(baseline, base_missing), _missing_rate(current, current_missing))
    flags = []
    if rates[1] - rates[0] > limits.missing:
        flags.append(f"missing rate {rates[1]:.1%} (baseline {rates[0]:.1%}) > +{limits.missing:.1%}")
    base_values, current_values = baseline[~base_missing], current[~current_missing]
    if kind == "numeric":
        return _numeric(name, base_values.astype(float), current_values.astype(float), rates, flags, limits)
    return _categorical(name, base_values, current_values, rates, flags, limits)


def _numeric(
    name: str,
    baseline: np.ndarray,
    current: np.ndarray,
    rates: tuple[float, float],
    flags: list[str],
    limits: Thresholds,
) -> ColumnDrift:
    psi = statistics.psi(baseline, current)
    distance = statistics.wasserstein(baseline, current)
    spread = float(np.std(baseline)) if baseline.size else 0.0
    outside = statistics.out_of_range_share(baseline, current)
    if psi > limits.psi:
        flags.append(f"PSI {psi:.3f} > {limits.psi:g}")
    if outside > limits.out_of_range:
        flags.append(f"{outside:.1%} of values outside the baseline's range > {limits.out_of_range:.1%}")
    return ColumnDrift(
        name,
        "numeric",
        baseline_rows=int(baseline.size),
        current_rows=int(current.size),
        baseline_missing=rates[0],
        current_missing=rates[1],
        statistics={
            "psi": psi,
            "wasserstein": distance,
            # in baseline standard deviations: comparable across columns of any unit
            "wasserstein_std": distance / spread if spread > 0 else 0.0,
            "out_of_range": outside,
        },
        flags=flags,
        summary={
            "baseline": _numbers(baseline),
            "current": _numbers(current),
            "histogram": histogram(baseline, current),
        },
    )


def histogram(baseline: np.ndarray, current: np.ndarray) -> dict[str, list[float]]:
    """Shares of both sides in common equal-width bins over both sides' range: what the report plots."""
    both = np.concatenate([baseline, current])
    if not both.size:
        return {"edges": [0.0, 1.0], "baseline": [0.0], "current": [0.0]}
    low, high = float(both.min()), float(both.max())
    edges = np.linspace(low, high if high > low else low + 1.0, HISTOGRAM_BINS + 1)
    shares = [np.histogram(side, edges)[0] / max(side.size, 1) for side in (baseline, current)]
    return {"edges": edges.tolist(), "baseline": shares[0].tolist(), "current": shares[1].tolist()}


def _numbers(values: np.ndarray) -> dict[str, float | None]:
    if not values.size:
        return {"min": None, "max": None, "mean": None}
    return {"min": float(values.min()), "max": float(values.max()), "mean": float(values.mean())}


def _categorical(
    name: str,
    baseline: np.ndarray,
    current: np.ndarray,
    rates: tuple[float, float],
    flags: list[str],
    limits: Thresholds,
) -> ColumnDrift:
    base_counts, current_counts = Counter(map(category, baseline)), Counter(map(category, current))
    unseen = Counter({value: count for value, count in current_counts.items() if value not in base_counts})
    unseen_share = sum(unseen.values()) / max(current.size, 1)
    js = statistics.jensen_shannon(base_counts, current_counts)
    if js > limits.js:
        flags.append(f"Jensen-Shannon distance {js:.3f} > {limits.js:g}")
    if unseen_share > limits.unseen:
        names = ", ".join(repr(value) for value, _ in unseen.most_common(3))
        flags.append(f"{unseen_share:.1%} of values in unseen categories ({names}) > {limits.unseen:.1%}")
    return ColumnDrift(
        name,
        "categorical",
        baseline_rows=int(baseline.size),
        current_rows=int(current.size),
        baseline_missing=rates[0],
        current_missing=rates[1],
        statistics={
            "js": js,
            "chi_square_p": statistics.chi_square_p(base_counts, current_counts),
            "unseen": unseen_share,
        },
        flags=flags,
        unseen=dict(unseen.most_common(MOST_UNSEEN)),
        summary={"baseline": _shares(base_counts), "current": _shares(current_counts)},
    )


def category(value: Any) -> str:
    """A value as the category it names: text as it is; booleans and numbers as JSON writes them."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _shares(counts: Counter[str]) -> dict[str, float]:
    total = sum(counts.values()) or 1
    return {value: count / total for value, count in counts.most_common(MOST_SHARES)}


# ------------------------------------------------------------------------------------------ the whole comparison


@dataclass
class Comparison:
    """Everything the report and the JSON summary say: the window, the rows on each side, each column's and each
    prediction's drift, and what could not be read."""

    model: str
    baseline_source: str
    capture_source: str
    since: str | None
    until: str | None
    records: int
    baseline_rows: int
    current_rows: int
    thresholds: Thresholds
    columns: list[ColumnDrift]
    predictions: list[ColumnDrift]
    notes: list[str] = field(default_factory=list)  # records skipped, columns not monitored, and why

    @property
    def drifted_columns(self) -> list[str]:
        return [column.name for column in self.columns if column.drifted]

    @property
    def drifted_predictions(self) -> list[str]:
        return [column.name for column in self.predictions if column.drifted]

    @property
    def drifted(self) -> bool:
        return bool(self.drifted_columns or self.drifted_predictions)

    def to_json(self) -> dict[str, Any]:
        def column(drift: ColumnDrift) -> dict[str, Any]:
            return {**asdict(drift), "drifted": drift.drifted}

        return {
            "drifted": self.drifted,
            "drifted_columns": self.drifted_columns,
            "drifted_predictions": self.drifted_predictions,
            "model": self.model,
            "baseline": {"source": self.baseline_source, "rows": self.baseline_rows},
            "current": {
                "source": self.capture_source,
                "since": self.since,
                "until": self.until,
                "records": self.records,
                "rows": self.current_rows,
            },
            "thresholds": asdict(self.thresholds),
            "columns": [column(drift) for drift in self.columns],
            "predictions": [column(drift) for drift in self.predictions],
            "notes": self.notes,
        }
