"""The two gates of `servestack models optimize`, chosen by the model's prediction output.

- **Accuracy** (classifiers: integer, string or boolean predictions). With a label on every eval row, both
  models' accuracy against the labels; without, the optimized model's agreement with the float model. The drop,
  computed exactly, must be at most `--max-accuracy-drop` points.
- **Tolerance** (regressors: float predictions, one target or several). Every value the optimized model gives
  must be within `--max-abs-error` + `--max-rel-error` x |float model's value| of the float model's (the rule of
  `numpy.isclose`). Defaults: 1e-4 absolute and 0.01 relative, i.e. within 1% (plus 1e-4 for values near zero):
  graph optimizations change answers by float rounding at most, and an int8 model that moves an answer by more
  than 1% is not the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from servestack.optimize.rows import Rows, invalid

if TYPE_CHECKING:
    import numpy as np

    from servestack.inference.manifest import AccuracyFigures, Manifest
    from servestack.inference.service import ServedModel

Gate = Literal["accuracy", "tolerance"]
CLASS_DTYPES = frozenset({"int64", "int32", "int8", "uint8", "string", "bool"})
DEFAULT_MAX_DROP = "0.5"
DEFAULT_MAX_ABS_ERROR = "1e-4"
DEFAULT_MAX_REL_ERROR = "0.01"


def gate_of(manifest: Manifest) -> Gate:
    """Accuracy for class predictions, tolerance for values (a regressor)."""
    spec = next(o for o in manifest.outputs if o.name == manifest.primary_output)
    return "accuracy" if spec.dtype in CLASS_DTYPES else "tolerance"


def parse_max_drop(text: str) -> Fraction:
    """The gate in points, kept exact (0.5 is 1/2, not 0.5000000000000001)."""
    try:
        value = Fraction(Decimal(text.strip()))
    except (InvalidOperation, ValueError):
        value = Fraction(-1)
    if value < 0 or value > 100:
        raise invalid(
            f"--max-accuracy-drop: {text!r} is not a number of points in 0..100",
            field="--max-accuracy-drop",
            value=text,
            allowed="0..100 (percentage points)",
        )
    return value


@dataclass(frozen=True)
class Tolerance:
    """|optimized - float| <= max_abs + max_rel * |float|, for every value of every eval row."""

    max_abs: float
    max_rel: float

    @classmethod
    def parse(cls, max_abs: str, max_rel: str) -> Tolerance:
        return cls(_non_negative("--max-abs-error", max_abs), _non_negative("--max-rel-error", max_rel))

    @property
    def rule(self) -> str:
        return f"|optimized - float| <= {self.max_abs:g} + {self.max_rel:g} x |float|"

    @property
    def flags(self) -> str:
        return f"--max-abs-error {self.max_abs:g}, --max-rel-error {self.max_rel:g}"


def _non_negative(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise invalid(f"{flag}: {text!r} is not a number >= 0", field=flag, value=text, allowed="a number >= 0")
    return value


# ------------------------------------------------------------------------------------------ accuracy


def predictions(model: ServedModel, rows: Rows) -> list[Any]:
    """The primary output of every row, as Python values."""
    import numpy as np

    output = model.manifest.primary_output
    found: list[Any] = []
    for chunk in rows.chunks:
        found.extend(np.asarray(model.predict(chunk)[output]).reshape(-1).tolist())
    return found


def _normalise_label(label: Any, manifest: Manifest) -> Any:
    """A label as the model predicts it: a label name becomes its class id when the model predicts integer ids
    that the manifest names; a model that predicts its string labels is compared with them as they are."""
    if gate_of(manifest) == "accuracy" and isinstance(label, str) and manifest.labels and label in manifest.labels:
        spec = next(o for o in manifest.outputs if o.name == manifest.primary_output)
        if spec.dtype != "string":
            return manifest.labels.index(label)
    return label


def measure_accuracy(
    float_model: ServedModel, optimized: ServedModel, rows: Rows, max_drop: Fraction
) -> tuple[AccuracyFigures, Fraction]:
    """Percentages as exact fractions until the figures are written: the gate compares exact values."""
    from servestack.inference.manifest import AccuracyFigures

    reference = predictions(float_model, rows)
    candidate = predictions(optimized, rows)
    total = len(reference)
    if rows.labels is not None:
        expected = [_normalise_label(label, float_model.manifest) for label in rows.labels]
        float_pct = Fraction(100 * sum(p == e for p, e in zip(reference, expected, strict=True)), total)
        optimized_pct = Fraction(100 * sum(p == e for p, e in zip(candidate, expected, strict=True)), total)
        measure: Literal["accuracy", "agreement"] = "accuracy"
    else:
        float_pct = Fraction(100)
        optimized_pct = Fraction(100 * sum(p == r for p, r in zip(candidate, reference, strict=True)), total)
        measure = "agreement"
    drop = float_pct - optimized_pct
    figures = AccuracyFigures(
        measure=measure,
        rows=total,
        source=rows.source,
        float_percent=round(float(float_pct), 4),
        optimized_percent=round(float(optimized_pct), 4),
        drop_points=round(float(drop), 4),
        max_drop_points=float(max_drop),
    )
    return figures, drop


# ------------------------------------------------------------------------------------------ tolerance


@dataclass(frozen=True)
class ToleranceFigures:
    """What the tolerance gate measured: rows outside the bounds, the largest errors, and the worst row."""

    tolerance: Tolerance
    rows: int
    rows_outside: int
    max_abs_error: float
    max_rel_error: float
    worst: str  # `line 17 of eval.jsonl: float 151.2, optimized 149.9`

    @property
    def holds(self) -> bool:
        return self.rows_outside == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.tolerance.rule,
            "max_abs_error_allowed": self.tolerance.max_abs,
            "max_rel_error_allowed": self.tolerance.max_rel,
            "rows": self.rows,
            "rows_outside": self.rows_outside,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "worst": self.worst,
        }


def _values(model: ServedModel, rows: Rows) -> np.ndarray:
    """The primary output of every row as float64, one row per line ([N, targets])."""
    import numpy as np

    output = model.manifest.primary_output
    parts = [np.asarray(model.predict(chunk)[output], dtype=np.float64) for chunk in rows.chunks]
    return np.concatenate([part.reshape(len(part), -1) for part in parts])


def measure_tolerance(
    float_model: ServedModel, optimized: ServedModel, rows: Rows, tolerance: Tolerance
) -> tuple[AccuracyFigures, ToleranceFigures]:
    """The optimized model's values against the float model's. The manifest's figures record the share of
    rows within the bounds as an agreement (every row must be: a gate of 0 points)."""
    import numpy as np

    from servestack.inference.manifest import AccuracyFigures

    reference = _values(float_model, rows)
    candidate = _values(optimized, rows)
    both_nan = np.isnan(reference) & np.isnan(candidate)
    error = np.where(both_nan, 0.0, np.nan_to_num(np.abs(candidate - reference), nan=np.inf))
    scale = np.abs(reference)
    relative = np.divide(error, scale, out=np.where(error > 0, np.inf, 0.0), where=scale > 0)
    excess = error - (tolerance.max_abs + tolerance.max_rel * np.nan_to_num(scale))
    per_row = excess.max(axis=1)
    outside = int((per_row > 0).sum())
    worst = int(np.argmax(per_row))
    figures = ToleranceFigures(
        tolerance=tolerance,
        rows=len(reference),
        rows_outside=outside,
        max_abs_error=float(error.max()),
        max_rel_error=float(relative.max()),
        worst=(f"{rows.where(worst)}: float {_shown(reference[worst])}, optimized {_shown(candidate[worst])}"),
    )
    total = len(reference)
    within = Fraction(100 * (total - outside), total)
    accuracy = AccuracyFigures(
        measure="agreement",
        rows=total,
        source=rows.source,
        float_percent=100.0,
        optimized_percent=round(float(within), 4),
        drop_points=round(float(100 - within), 4),
        max_drop_points=0.0,
    )
    return accuracy, figures


def _shown(values: np.ndarray) -> Any:
    """A row of one target as a number, of several as a list."""
    listed = values.tolist()
    return listed[0] if len(listed) == 1 else listed
