"""What `servestack monitor` compares, gathered from decoded requests and from answers: a model's input columns
and its predictions, as columns of values.

The inputs come as the arrays the model's own decoder produced (`ServedModel.decode`, which every mode runs), so
a captured request reads exactly as the server read it. A tabular model's columns are its manifest's
(servestack/inference/columns.py); a tensor model's `[N, k]` input of at most `MAX_TENSOR_FEATURES` values is
k numeric features `input[j]`; larger inputs (images, sequences) are not monitored, which the report says.
The predictions come from the answer JSON (servestack/inference/answers.py): `labels` (else `predictions`) of
a classifier are its class balance, each row's highest probability its confidence; a regressor's
`predictions` are numbers, one column per target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servestack.inference.answers import label_lookup
from servestack.inference.columns import columns_of
from servestack.inference.manifest import Manifest
from servestack.monitor.drift import Kind

MAX_TENSOR_FEATURES = 64
PREDICTION = "prediction"
CONFIDENCE = "confidence"


@dataclass(frozen=True)
class Feature:
    """One monitored input column: where its values are in the decoded arrays."""

    name: str
    kind: Kind
    input: str
    index: int | None  # the column of a `[N, k]` input; None: the `[N, 1]` input is this column

    def values(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        array = arrays[self.input]
        return array[:, 0] if self.index is None else array[:, self.index]


def features_of(manifest: Manifest) -> tuple[list[Feature], list[str]]:
    """The model's monitored input columns, and a note for each input left out."""
    columns = columns_of(manifest)
    if columns:
        kinds = {column.name: _kind_of(column.dtype) for column in columns}
        return [Feature(c.name, kinds[c.name], c.input, c.index) for c in columns], []
    features: list[Feature] = []
    notes: list[str] = []
    for spec in manifest.inputs:
        width = spec.shape[1] if len(spec.shape) == 2 else None
        if width is None or width > MAX_TENSOR_FEATURES:
            notes.append(
                f"input {spec.name!r} of shape {list(spec.shape)} is not monitored: only named columns and [N, k] "
                f"inputs of at most {MAX_TENSOR_FEATURES} values are"
            )
            continue
        kind = _kind_of(spec.dtype)
        features += [Feature(f"{spec.name}[{j}]" if width > 1 else spec.name, kind, spec.name, j) for j in range(width)]
    return features, notes


def _kind_of(dtype: str) -> Kind:
    return "categorical" if dtype in ("string", "bool") else "numeric"


def is_classifier(manifest: Manifest) -> bool:
    primary = next(spec for spec in manifest.outputs if spec.name == manifest.primary_output)
    return manifest.labels is not None or manifest.probability_output is not None or primary.dtype == "string"


@dataclass
class Table:
    """Columns of values gathered batch by batch: input columns by feature, predictions by their name."""

    features: list[Feature]
    classifier: bool
    labels: dict[int, str | int] | None = None
    inputs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    outputs: dict[str, list[Any]] = field(default_factory=dict)
    rows: int = 0

    @classmethod
    def for_model(cls, manifest: Manifest) -> tuple[Table, list[str]]:
        features, notes = features_of(manifest)
        labels = label_lookup(manifest.labels) if manifest.labels is not None else None
        return cls(features, is_classifier(manifest), labels), notes

    def add_inputs(self, arrays: Mapping[str, np.ndarray], absent: frozenset[str] = frozenset()) -> None:
        """A decoded batch; `absent`: columns the record left out (personal data), filled in only to decode."""
        for feature in self.features:
            if feature.name not in absent:
                self.inputs.setdefault(feature.name, []).append(feature.values(arrays))
        self.rows += len(next(iter(arrays.values()))) if arrays else 0

    def add_answer(self, answer: Mapping[str, Any]) -> bool:
        """An answer's predictions (its JSON object); False when it holds none (an error, a hook's own form)."""
        predictions = answer.get("predictions")
        if not isinstance(predictions, list):
            return False
        named = answer.get("labels")
        if self.classifier and isinstance(named, list) and len(named) == len(predictions):
            predictions = named
        self._add_predictions(predictions)
        probabilities = answer.get("probabilities")
        if self.classifier and isinstance(probabilities, list) and len(probabilities) == len(predictions):
            self.outputs.setdefault(CONFIDENCE, []).extend(_confidence(row) for row in probabilities)
        return True

    def add_csv_answer(self, rows: list[list[str]]) -> bool:
        """A CSV answer (`prediction[,proba_...]` per row, a header row or not)."""
        if rows and rows[0] and rows[0][0].startswith(PREDICTION):
            rows = rows[1:]
        if not rows:
            return False
        predictions: list[Any] = [_number_or_text(cells[0]) for cells in rows]
        if self.classifier and self.labels is not None:
            predictions = [self.labels.get(value, value) if isinstance(value, int) else value for value in predictions]
        self._add_predictions(predictions)
        if self.classifier and all(len(cells) > 2 for cells in rows):
            self.outputs.setdefault(CONFIDENCE, []).extend(_confidence(cells[1:]) for cells in rows)
        return True

    def _add_predictions(self, predictions: list[Any]) -> None:
        if predictions and isinstance(predictions[0], list) and not self.classifier:  # one column per target
            for j in range(len(predictions[0])):
                column = [row[j] if isinstance(row, list) and len(row) > j else None for row in predictions]
                self.outputs.setdefault(f"{PREDICTION}[{j}]", []).extend(column)
            return
        self.outputs.setdefault(PREDICTION, []).extend(predictions)

    def input_values(self, feature: Feature) -> np.ndarray:
        parts = self.inputs.get(feature.name)
        if not parts:
            return np.empty(0, dtype=object if feature.kind == "categorical" else np.float64)
        return np.concatenate(parts)

    def output_values(self, name: str) -> np.ndarray:
        values = self.outputs.get(name, [])
        if name == CONFIDENCE or not self.classifier:
            return np.array([np.nan if value is None else value for value in values], dtype=np.float64)
        return np.array(values, dtype=object)

    def output_kind(self, name: str) -> Kind:
        return "categorical" if self.classifier and name != CONFIDENCE else "numeric"


def _confidence(row: Any) -> float:
    """A row's highest class probability (a list, or an object keyed by label: `probabilities=by-label`)."""
    values = row.values() if isinstance(row, dict) else row
    try:
        return max(float(value) for value in values)
    except (TypeError, ValueError):
        return float("nan")


def _number_or_text(cell: str) -> Any:
    text = cell.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text
