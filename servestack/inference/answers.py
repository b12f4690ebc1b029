"""Answers: model outputs -> the response fields every mode returns, written in the negotiated type.

`default_response` holds what an answer says (predictions, flat for a single target; probabilities, keyed by
class label on request; the class labels as trained; other outputs by name); `encode_response` writes it as
JSON, CSV (each float at its shortest text, a header row on request) or `.npy`. `AnswerPlan` writes a model's
usual JSON and `.npy` answers straight from its outputs, byte for byte what the general path writes
(tests/unit/test_codec_properties.py holds the two equal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from servestack.inference.codecs import NPY_DTYPE_SET, encode_npy, json_default, npy_header
from servestack.inference.errors import NotAcceptable
from servestack.inference.manifest import Manifest
from servestack.inference.media_types import CSV, CSV_HEADER, JSON, JSON_BY_LABEL, NPY, Encoded

# The `.npy` headers an answer plan remembers, by its outputs' shapes, are bounded like the codecs' memos.
_NPY_HEADER_MEMO_LIMIT = 1024


def flat(predictions: Any) -> Any:
    """A single-target model's `[N, 1]` predictions as `[N]`: one value per row, as a client expects them."""
    if type(predictions) is np.ndarray and predictions.ndim == 2 and predictions.shape[1] == 1:
        return predictions.reshape(-1)
    return predictions


def default_response(
    manifest: Manifest, outputs: Mapping[str, np.ndarray], *, with_labels: bool = True, by_label: bool = False
) -> dict[str, Any]:
    """Predictions (flat for a single target), probabilities and class labels when the manifest names them;
    other outputs by name. `with_labels=False` leaves the labels out: only JSON writes them, and naming each
    row's class is per-row Python that a CSV or `.npy` answer would throw away. `by_label`: each row's
    probabilities as an object keyed by class label (`JSON_BY_LABEL`)."""
    primary, probabilities = manifest.primary_output, manifest.probability_output
    predictions = flat(outputs[primary])
    response: dict[str, Any] = {"model": manifest.name, "version": manifest.version, "predictions": predictions}
    if probabilities is not None:
        response["probabilities"] = outputs[probabilities]
        if by_label and manifest.labels is not None:
            response["probabilities"] = _keyed_by_label(manifest.labels, outputs[probabilities])
    if with_labels and manifest.labels is not None and np.ndim(predictions) <= 1:
        # One label per row: predictions of several columns (scores, say) are no class to name.
        response["labels"] = _label_names(manifest.labels, np.asarray(predictions).reshape(-1))
    if len(outputs) > (2 if probabilities is not None else 1):
        extra = {name: value for name, value in outputs.items() if name not in (primary, probabilities)}
        if not {"predictions", "probabilities"}.intersection(extra):
            response["outputs"] = extra
    return response


def label_lookup(labels: tuple[str | int, ...]) -> dict[int, str | int]:
    """What a predicted integer means: string labels are named by class id (0..K-1, `--labels`); integer labels
    are the class values the model predicts, so each names itself."""
    if all(type(label) is int for label in labels):
        return {label: label for label in labels if type(label) is int}
    return dict(enumerate(labels))


def _label_names(labels: tuple[str | int, ...], predictions: np.ndarray) -> list[str | int]:
    lookup = label_lookup(labels)
    return [lookup.get(i, str(i)) if isinstance(i, int) else str(i) for i in predictions.tolist()]


def _keyed_by_label(labels: tuple[str | int, ...], probabilities: Any) -> Any:
    """Rows of probabilities as `{label: probability}` objects (JSON keys are text: an integer label is written
    as its digits); probabilities that are not one column per label are left as they are."""
    array = np.asarray(probabilities)
    if array.ndim != 2 or array.shape[1] != len(labels):
        return probabilities
    keys = [str(label) for label in labels]
    # numpy scalars, not `tolist()`'s Python floats: orjson writes a float32 at its own shortest text
    return [dict(zip(keys, row, strict=True)) for row in array]


def encode_response(fields: Mapping[str, Any], media_type: str, labels: Sequence[str | int] | None = None) -> Encoded:
    """Write the response fields in the negotiated type. CSV carries `predictions` (and `probabilities`), each
    value at the shortest text that reads back to it in its own dtype (a float32 `197.45694`, not float64's
    `197.45693969726562`); `CSV_HEADER` adds a header row (`prediction`, `proba_<label>`; `labels`: the
    probability columns' class labels). `.npy` carries the numeric arrays of `npy_arrays` back to back
    (`predictions` first)."""
    if media_type in (JSON, JSON_BY_LABEL):
        return Encoded(orjson.dumps(fields, option=orjson.OPT_SERIALIZE_NUMPY, default=json_default), JSON)
    if media_type == NPY:
        return Encoded(encode_npy([array for _, array in npy_arrays(fields)]), NPY)
    predictions = np.asarray(fields.get("predictions"))
    table = predictions.reshape(predictions.shape[0], -1) if predictions.ndim else predictions.reshape(1, 1)
    columns = [table[:, j] for j in range(table.shape[1])]
    names = ["prediction"] if len(columns) == 1 else [f"prediction_{j}" for j in range(len(columns))]
    probabilities = fields.get("probabilities")
    if probabilities is not None:
        scores = np.asarray(probabilities)
        scores = scores.reshape(scores.shape[0], -1) if scores.ndim else scores.reshape(1, 1)
        columns.extend(scores[:, j] for j in range(scores.shape[1]))
        keys = labels if labels is not None and len(labels) == scores.shape[1] else range(scores.shape[1])
        names.extend(f"proba_{key}" for key in keys)
    cells = [_csv_column(column) for column in columns]
    lines = [",".join(row) for row in zip(*cells, strict=True)]
    if media_type == CSV_HEADER:
        lines.insert(0, ",".join(_csv_text(name) for name in names))
        return Encoded(("\n".join(lines) + "\n").encode(), CSV_HEADER)
    return Encoded(("\n".join(lines) + "\n").encode(), CSV)


def npy_answer(manifest: Manifest, outputs: Mapping[str, np.ndarray]) -> bytes:
    """`encode_response(default_response(manifest, outputs, with_labels=False), NPY).body` in one pass over the
    outputs, without the response dict: how a model without a postprocess hook answers every `.npy` request
    (tests/unit/test_codecs.py holds the two equal). Anything unusual (an output that is not an array)
    takes the general path, which also raises its 406 for predictions .npy cannot carry."""
    primary, probability = manifest.primary_output, manifest.probability_output
    predictions = flat(outputs[primary])
    if type(predictions) is not np.ndarray or predictions.dtype not in NPY_DTYPE_SET:
        return encode_response(default_response(manifest, outputs, with_labels=False), NPY).body
    arrays = [predictions]
    if probability is not None:
        probabilities = outputs[probability]
        if isinstance(probabilities, np.ndarray) and probabilities.dtype in NPY_DTYPE_SET:
            arrays.append(probabilities)
    if len(outputs) > (2 if probability is not None else 1):
        extra = [(name, value) for name, value in outputs.items() if name not in (primary, probability)]
        if not any(name in ("predictions", "probabilities") for name, _ in extra):
            arrays.extend(value for _, value in extra if isinstance(value, np.ndarray) and value.dtype in NPY_DTYPE_SET)
    return encode_npy(arrays)


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """How a model without a postprocess hook writes its usual answers, worked out once per loaded model:
    `json_answer` and `planned_npy_answer` write the bytes of `encode_response(default_response(...))` without
    building the response dict, naming labels through a dict per row or deriving `.npy` headers per array. It
    covers models whose outputs are the prediction and, optionally, the probabilities (a classifier's label and
    probabilities, a regressor's one output); a model with other outputs takes the general path."""

    primary: str
    probability: str | None
    output_count: int
    json_head: bytes  # `{"model":...,"version":...,"predictions":`
    labels: tuple[str | int, ...] | None
    label_by_id: dict[int, bytes] | None  # each label as JSON, by the integer the model predicts for it
    # The prediction is a string tensor: onnxruntime gives it as `str` objects, so its list needs no type check.
    text_predictions: bool
    npy_dtypes: tuple[np.dtype[Any], ...] | None  # the dtypes `.npy` carries, in order; None: not `.npy`-able
    # The `.npy` headers of the answer arrays, by their shapes (bounded).
    npy_headers: dict[tuple[tuple[int, ...], ...], tuple[bytes, ...]]


def answer_plan(manifest: Manifest) -> AnswerPlan | None:
    """The plan for a model whose outputs are its prediction and at most its probabilities; None otherwise."""
    primary, probability = manifest.primary_output, manifest.probability_output
    if probability == primary or len(manifest.outputs) != (2 if probability is not None else 1):
        return None
    dtypes = {spec.name: spec.numpy_dtype for spec in manifest.outputs}
    carried = tuple(dtypes[name] for name in (primary, probability) if name is not None)
    npy_dtypes = carried if all(dtype in NPY_DTYPE_SET for dtype in carried) else None
    head = b'{"model":' + orjson.dumps(manifest.name) + b',"version":' + orjson.dumps(manifest.version)
    labels = manifest.labels
    return AnswerPlan(
        primary,
        probability,
        len(manifest.outputs),
        head + b',"predictions":',
        labels,
        {key: orjson.dumps(label) for key, label in label_lookup(labels).items()} if labels is not None else None,
        dtypes[primary] == np.dtype(object),
        npy_dtypes,
        {},
    )


_NUMPY_OPTION = orjson.OPT_SERIALIZE_NUMPY


def json_answer(plan: AnswerPlan, outputs: Mapping[str, np.ndarray]) -> bytes | None:
    """`encode_response(default_response(manifest, outputs), JSON).body`, written piece by piece (orjson writes
    each array exactly as it would inside the dict); None for outputs the plan does not cover."""
    if len(outputs) != plan.output_count:
        return None
    predictions = outputs[plan.primary]
    if type(predictions) is not np.ndarray:
        return None
    if predictions.ndim == 2 and predictions.shape[1] == 1:  # `flat`
        predictions = predictions.reshape(-1)
    names: bytes | None = None
    if predictions.dtype == object and predictions.ndim == 1:
        # Class names (a string-labelled classifier): each row's label is its prediction (`_label_names` of a
        # str is itself), so the one list is written once and serves as both.
        items = predictions.tolist()
        written = orjson.dumps(items, option=_NUMPY_OPTION, default=json_default)
        if plan.text_predictions or set(map(type, items)) <= {str}:
            names = written
    else:
        written = orjson.dumps(predictions, option=_NUMPY_OPTION, default=json_default)
    if plan.probability is not None:
        probabilities = orjson.dumps(outputs[plan.probability], option=_NUMPY_OPTION, default=json_default)
        written = b"".join((written, b',"probabilities":', probabilities))
    label_by_id = plan.label_by_id
    if label_by_id is None or predictions.ndim > 1:  # several columns per row: no class to name (default_response)
        return b"".join((plan.json_head, written, b"}"))
    if predictions.dtype.kind in "iub":  # class ids (and booleans, which `_label_names` takes for 0 and 1)
        ids = predictions.reshape(-1).tolist() if predictions.ndim != 1 else predictions.tolist()
        try:
            return b"".join((plan.json_head, written, b',"labels":[', b",".join([label_by_id[i] for i in ids]), b"]}"))
        except KeyError:  # an id with no label: `_label_names` writes it as text
            pass
    assert plan.labels is not None
    if names is None:
        names = orjson.dumps(_label_names(plan.labels, predictions.reshape(-1)))
    return b"".join((plan.json_head, written, b',"labels":', names, b"}"))


def planned_npy_answer(plan: AnswerPlan, outputs: Mapping[str, np.ndarray]) -> bytes | None:
    """`npy_answer`, with the headers looked up by the arrays' shapes; None for outputs the plan does not cover
    (another dtype, a non-contiguous array, an output more or less), which `npy_answer` then writes."""
    dtypes = plan.npy_dtypes
    if dtypes is None or len(outputs) != plan.output_count:
        return None
    predictions = outputs[plan.primary]
    if type(predictions) is not np.ndarray or predictions.dtype != dtypes[0]:
        return None
    if predictions.ndim == 2 and predictions.shape[1] == 1:  # `flat`
        predictions = predictions.reshape(-1)
    if plan.probability is None:
        arrays: tuple[np.ndarray, ...] = (predictions,)
        shapes: tuple[tuple[int, ...], ...] = (predictions.shape,)
    else:
        probabilities = outputs[plan.probability]
        if type(probabilities) is not np.ndarray or probabilities.dtype != dtypes[1]:
            return None
        arrays, shapes = (predictions, probabilities), (predictions.shape, probabilities.shape)
    headers = plan.npy_headers.get(shapes)
    if headers is None:  # a header depends on dtype and shape only, so strided arrays may fill the memo too
        headers = tuple(npy_header(array) for array in arrays)
        if len(plan.npy_headers) < _NPY_HEADER_MEMO_LIMIT:
            plan.npy_headers[shapes] = headers
    try:  # each array goes into the join as it is: its memory, no `tobytes` copy (`encode_npy`)
        if len(arrays) == 1:
            return b"".join((headers[0], predictions))  # type: ignore[arg-type]  # numpy's buffer protocol
        return b"".join((headers[0], predictions, headers[1], arrays[1]))  # type: ignore[arg-type]
    except TypeError:  # a non-contiguous view is no bytes-like object: `npy_answer` copies it
        return None


def npy_arrays(fields: Mapping[str, Any]) -> list[tuple[str, np.ndarray]]:
    """The arrays an `.npy` answer carries, in order: `predictions`, then `probabilities`, then each numeric
    array of `outputs` (a multi-output model's other outputs). `np.load` of the body reads the first, the
    predictions, so a single-output reader sees what it always saw; calling np.load again on the same stream
    gives the rest, in this order. Strings (class names) are not numbers: `.npy` leaves them out when they are
    extras, and refuses them as predictions (406)."""
    predictions = np.asarray(fields.get("predictions"))
    if predictions.dtype not in NPY_DTYPE_SET:
        raise NotAcceptable(
            f"predictions are {predictions.dtype.name}, which .npy cannot carry without pickling",
            field="Accept",
            value=NPY,
            allowed="application/json or text/csv for this model",
        )
    found = [("predictions", predictions)]
    probabilities = fields.get("probabilities")
    if isinstance(probabilities, np.ndarray) and probabilities.dtype in NPY_DTYPE_SET:
        found.append(("probabilities", probabilities))
    extra = fields.get("outputs")
    if isinstance(extra, Mapping):
        found.extend(
            (f"outputs.{name}", value)
            for name, value in extra.items()
            if isinstance(value, np.ndarray) and value.dtype in NPY_DTYPE_SET
        )
    return found


def _csv_column(column: np.ndarray) -> list[str]:
    """A column's CSV cells: floats at the shortest text that reads back to the same value of their own dtype
    (numpy's `str` of a float32 scalar; whole numbers without `.0`), integers as digits, text quoted where it
    holds a comma, quote or line end."""
    if column.dtype.kind == "f":
        return [str(int(value)) if value.is_integer() else str(column.dtype.type(value)) for value in column.tolist()]
    if column.dtype.kind in "iub":
        return [str(int(value)) for value in column.tolist()]
    return [_csv_cell(value) for value in column.tolist()]


def _csv_cell(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, np.floating):
        return str(int(value)) if float(value).is_integer() else str(value)
    return _csv_text(str(value.item() if isinstance(value, np.generic) else value))


def _csv_text(text: str) -> str:
    if any(mark in text for mark in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text
