"""The tabular request forms, by column name: what MLflow / Databricks serving, MLServer's pandas codec and the
SageMaker scikit-learn container take.

    {"dataframe_split": {"columns": [...], "data": [[...], ...], "index": [...]}}
    {"dataframe_records": [{"<column>": value, ...}, ...]}
    {"instances": [{"<column>": value, ...}, ...]}          row objects
    {"inputs": {"<column>": [v1, v2, ...]}}                 one-dimensional lists, one per column
    CSV whose first row names the columns (`text/csv; header=present`, or a first row equal to the names)

They apply to a model with columns (servestack/inference/columns.py). The tensor forms (`instances` of lists, `inputs`
of nested lists, CSV without a header, `.npy`) keep their own path in servestack/inference/codecs.py, untouched: these
functions return None for them, and are only called once the tensor fast paths have declined a body.
"""

from __future__ import annotations

from typing import Any

from servestack.inference.columns import (
    arrays_from_columns,
    columns_from_csv,
    columns_from_records,
    columns_from_rows,
    columns_from_split,
    columns_of,
)
from servestack.inference.errors import InvalidInput, short_repr
from servestack.inference.input_checks import validate_inputs
from servestack.inference.manifest import Manifest
from servestack.inference.runtime import Arrays

FORMS = ("dataframe_split", "dataframe_records", "instances", "inputs")
_ALLOWED = (
    '{"dataframe_split": {"columns": [...], "data": [[...]]}}, {"dataframe_records": [{...}]}, '
    '{"instances": [...]} or {"inputs": {...}}'
)


def json_arrays(payload: Any, manifest: Manifest, *, max_rows: int) -> Arrays | None:
    """The input arrays of a JSON request in a by-name form; None for a tensor form (the codecs' path)."""
    if type(payload) is not dict:
        return None
    given = [form for form in FORMS if form in payload]
    if len(given) > 1 and ("dataframe_split" in given or "dataframe_records" in given):
        raise InvalidInput(
            f"body: give exactly one of {', '.join(FORMS)}; got {given}", field="body", value=given, allowed=_ALLOWED
        )
    if "dataframe_split" in payload:
        columns = columns_from_split(payload["dataframe_split"], field="dataframe_split")
        return arrays_from_columns(manifest, columns, field="dataframe_split", max_rows=max_rows)
    if "dataframe_records" in payload:
        columns = columns_from_records(payload["dataframe_records"], field="dataframe_records")
        return arrays_from_columns(manifest, columns, field="dataframe_records", max_rows=max_rows)
    if given == ["instances"]:
        rows = payload["instances"]
        if type(rows) is not list or not rows:
            return None
        if type(rows[0]) is dict and not columns_of(manifest):
            return tensor_rows(rows, manifest, field="instances", max_rows=max_rows)
        if type(rows[0]) is dict:
            return arrays_from_columns(
                manifest, columns_from_records(rows, field="instances"), field="instances", max_rows=max_rows
            )
        if type(rows[0]) is list and _rows_by_position(manifest):
            names = [column.name for column in columns_of(manifest)]
            return arrays_from_columns(
                manifest, columns_from_rows(names, rows, field="instances"), field="instances", max_rows=max_rows
            )
        return None
    if given == ["inputs"]:
        named = payload["inputs"]
        if type(named) is not dict or not columns_of(manifest):
            return None
        inputs = {spec.name for spec in manifest.inputs}
        by_tensor = named.keys() == inputs and not any(
            type(value) is list and value and type(value[0]) is not list for value in named.values()
        )
        if by_tensor:
            return None
        return arrays_from_columns(manifest, named, field="inputs", max_rows=max_rows)
    return None


def tensor_rows(rows: list[Any], manifest: Manifest, *, field: str, max_rows: int) -> Arrays:
    """TF-Serving's row form for a model of named tensor inputs: one object per row, each input by name
    (`{"instances": [{"input_ids": [...], "attention_mask": [...]}, ...]}`). Each input's rows are gathered and
    checked as its `inputs` form would be (ragged rows padded where the manifest declares a pad value); errors
    name `instances.<input>[row]...`."""
    names = [spec.name for spec in manifest.inputs]
    expected = set(names)
    if len(rows) > max_rows:
        raise InvalidInput(
            f"batch of {len(rows)} rows is over the limit", field=field, value=len(rows), allowed=f"1..{max_rows} rows"
        )
    for index, row in enumerate(rows):
        if type(row) is not dict or row.keys() != expected:
            keys = sorted(row)[:8] if type(row) is dict else type(row).__name__
            raise InvalidInput(
                f"{field}[{index}]: a row object needs exactly the inputs {names}, got {short_repr(keys)}",
                field=f"{field}[{index}]",
                value=keys,
                allowed=f"an object with keys {names}",
            )
    raw = {name: (f"{field}.{name}", [row[name] for row in rows]) for name in names}
    return validate_inputs(raw, manifest, max_batch_rows=max_rows)


def _rows_by_position(manifest: Manifest) -> bool:
    """Whether `instances` of lists are rows of the model's columns in order rather than rows of its one tensor:
    so for a model of several inputs (one per column), and for a model whose columns may hold NaN (the tensor
    path takes finite numbers only)."""
    columns = columns_of(manifest)
    return bool(columns) and (len(manifest.inputs) > 1 or any(column.allow_nan for column in columns))


def csv_by_columns(manifest: Manifest) -> bool:
    """Whether a CSV body without a header is read by column (several inputs, strings, integers or NaN) rather
    than as rows of the one float tensor."""
    columns = columns_of(manifest)
    if not columns:
        return False
    spec = manifest.inputs[0]
    return len(manifest.inputs) > 1 or not spec.dtype.startswith("float") or any(c.allow_nan for c in columns)


def csv_arrays(rows: list[list[str]], manifest: Manifest, *, header: bool | None, max_rows: int) -> Arrays | None:
    """The input arrays of CSV rows read by column name (a header row) or by column order; None for a plain CSV
    of one float tensor (the codecs' path). A header on a model with no named columns is dropped."""
    columns = columns_of(manifest)
    if not columns:
        return None
    if header is None:
        names = {column.name for column in columns}
        first = [cell.strip(" \t") for cell in rows[0]] if rows else []
        header = len(first) == len(names) and set(first) == names
        if not header and not csv_by_columns(manifest):
            return None
    cells = columns_from_csv(rows, manifest, header=header)
    return arrays_from_columns(manifest, cells, field="csv", max_rows=max_rows, text=True)
