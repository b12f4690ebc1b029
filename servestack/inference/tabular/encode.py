"""Predictions to parts, and parts back to the rows they hold.

A JSON Lines part holds one line per row: `{"file": ..., "line": ..., <response fields>}`, the fields the
online modes answer with, one value each (`predictions` becomes `prediction`, `labels` `label`). Lines are
built column by column: orjson writes each numeric output array in one call (floats in their shortest form,
float32 as float32) and the pieces are joined once; a Python dict per row would cost as much as inference.
A Parquet part holds the same fields as columns (`file`, `line`, then the fields).

Reading a part back (`json_keys`, `parquet_keys`) yields each record's (file, line), which the job compares
with the rows it scored: the vectorized reading of a prefix this module writes (`{"file":"...","line":N,`),
because parsing every record with a JSON library would cost as much as scoring it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from servestack.inference import codecs, media_types
from servestack.inference.columns import columns_of
from servestack.inference.errors import InternalError, ServingError
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.tabular.arrow_arrays import from_numbers, numbers, strings

SINGULAR = {"predictions": "prediction", "labels": "label"}
_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_MAX_LINE_DIGITS = 18


@dataclass(frozen=True)
class LabelColumn:
    """Each row's class name, as indices into the manifest's labels: written from those indices (a Parquet
    dictionary column, a numpy take of the names' JSON text) instead of a Python string per row."""

    names: tuple[str | int, ...]
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def tolist(self) -> list[str | int]:
        return [self.names[i] for i in self.indices.tolist()]


def batch_fields(model: ServedModel, outputs: Arrays, rows: int) -> dict[str, Any]:
    """`per_row_fields` of the model's response to `outputs`, the same fields in the same order as
    `model.respond`, with the class names as a `LabelColumn` when every prediction is a class index."""
    manifest = model.manifest
    if model.hooks.postprocess is not None or manifest.labels is None:
        return per_row_fields(model, model.respond(outputs), rows)
    predicted = np.asarray(outputs[manifest.primary_output]).reshape(-1)
    if (
        predicted.dtype.kind not in "iu"
        or not len(predicted)
        or not 0 <= predicted.min() <= predicted.max() < len(manifest.labels)
        or (type(manifest.labels[0]) is int and manifest.labels != tuple(range(len(manifest.labels))))
    ):  # integer labels are the predicted values themselves: an index names them only when they are 0..K-1
        return per_row_fields(model, model.respond(outputs), rows)  # a name is str(value): per row, as respond does
    unnamed = model.respond(outputs, media_types.NPY)  # every field but the labels, which only JSON names
    fields: dict[str, Any] = {}
    for name, value in unnamed.items():
        if name == "outputs":
            fields["labels"] = LabelColumn(manifest.labels, predicted)
        fields[name] = value
    fields.setdefault("labels", LabelColumn(manifest.labels, predicted))
    return per_row_fields(model, fields, rows)


def per_row_fields(model: ServedModel, fields: dict[str, Any], rows: int) -> dict[str, Any]:
    """The response fields with one value per row, named for one row. A response with no such field (or
    without its prediction) is an error, never a part of lines without predictions."""
    per_row: dict[str, Any] = {}
    for name, value in fields.items():
        one_per_row = isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == rows
        if one_per_row or (isinstance(value, list | LabelColumn) and len(value) == rows):
            per_row[SINGULAR.get(name, name)] = value
    primary = "prediction" if "predictions" in fields else None
    if not per_row or (primary is not None and primary not in per_row):
        raise InternalError(
            f"model {model.manifest.key}: the response to {rows} rows has no field with one value per row",
            field="predictions",
            value=sorted(fields)[:8],
            allowed=f"a list of {rows} values",
        )
    return per_row


def named_fields(model: ServedModel, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields a part writes: for a model with named columns, one `proba_<label>` column per class instead of
    a list of probabilities; for every model, `label` only where it differs from `prediction` (a model that
    predicts its class labels itself, strings or integers, would write each twice)."""
    manifest = model.manifest
    labels = manifest.labels
    prediction = next((spec for spec in manifest.outputs if spec.name == manifest.primary_output), None)
    same = prediction is not None and (
        prediction.dtype == "string" or (labels is not None and all(type(label) is int for label in labels))
    )
    by_label = labels is not None and bool(columns_of(manifest))
    named: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "label" and same and model.hooks.postprocess is None:
            continue
        if (
            name == "probabilities"
            and by_label
            and labels is not None
            and isinstance(value, np.ndarray)
            and value.ndim == 2
            and value.shape[1] == len(labels)
        ):
            for position, label in enumerate(labels):
                named[f"proba_{label}"] = np.ascontiguousarray(value[:, position])
            continue
        named[name] = value
    return named


def take(column: Any, indices: slice) -> Any:
    return column[indices]


# ------------------------------------------------------------------------------------------ JSON Lines

Cells = tuple[list[bytes], bool]  # each row's JSON text, and whether it still needs its [ ] around it


def json_cells(column: Any) -> Cells:
    """Each row's value of one field as JSON text."""
    if isinstance(column, np.ndarray) and column.dtype.kind in "biuf" and column.ndim in (1, 2) and len(column):
        try:
            text = orjson.dumps(np.ascontiguousarray(column), option=_NUMPY)
        except orjson.JSONEncodeError:
            text = b""  # a dtype orjson does not write (float16 on some builds): row by row below
        if text:
            if column.ndim == 1:
                return text[1:-1].split(b","), False
            if column.shape[1]:
                return text[2:-2].split(b"],["), True
    if isinstance(column, LabelColumn):
        names = np.array([orjson.dumps(name) for name in column.names], dtype=object)
        return names.take(column.indices).tolist(), False
    if isinstance(column, list) and all(type(value) is str for value in column):
        known: dict[str, bytes] = {}
        return [known.get(value) or known.setdefault(value, orjson.dumps(value)) for value in column], False
    rows = column.tolist() if isinstance(column, np.ndarray) else column
    return [orjson.dumps(value, option=_NUMPY, default=codecs.json_default) for value in rows], False


def json_lines(columns: Sequence[tuple[str, Cells]], rows: int) -> bytes:
    """One JSON object per row, `{"<name>": <cell>, ...}\\n`, joined once."""
    if not rows:
        return b""
    width = 2 * len(columns) + 1
    pieces: list[bytes] = [b""] * (rows * width)
    closer = b""
    for position, (name, (cells, bracketed)) in enumerate(columns):
        if len(cells) != rows:
            raise InternalError(f"field {name!r}: {len(cells)} values for {rows} rows")
        opener = b"[" if bracketed else b""
        pieces[2 * position :: width] = [
            closer + (b"," if position else b"{") + orjson.dumps(name) + b":" + opener
        ] * rows
        pieces[2 * position + 1 :: width] = cells
        closer = b"]" if bracketed else b""
    pieces[2 * len(columns) :: width] = [closer + b"}\n"] * rows
    return b"".join(pieces)


def located_lines(sources: list[bytes], lines: np.ndarray, fields: dict[str, Any]) -> bytes:
    """Part lines: `file` (each row's JSON-encoded source), `line`, then the fields."""
    line_cells = orjson.dumps(np.ascontiguousarray(lines, dtype=np.int64), option=_NUMPY)[1:-1].split(b",")
    columns: list[tuple[str, Cells]] = [("file", (sources, False)), ("line", (line_cells, False))]
    columns += [(name, json_cells(column)) for name, column in fields.items()]
    return json_lines(columns, len(lines))


def error_line(source: str, line: int, error: ServingError) -> bytes:
    return orjson.dumps({"file": source, "line": line, "error": error.to_dict()}) + b"\n"


def json_keys(body: bytes, sources: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(index into `sources`, line) of each record of a part or error part, read from the prefix every record
    starts with, `{"file":<source>,"line":<n>,"`; ValueError naming the first record that does not."""
    if not body:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if not body.endswith(b"\n"):
        raise ValueError("the last record does not end with a newline")
    prefixes = [b'{"file":' + orjson.dumps(source) + b',"line":' for source in sources]
    arr = np.frombuffer(body, dtype=np.uint8)
    padded = np.concatenate((arr, np.zeros(max(map(len, prefixes), default=0) + _MAX_LINE_DIGITS + 4, np.uint8)))
    ends = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    which = np.full(len(starts), -1, dtype=np.int64)
    after = np.zeros(len(starts), dtype=np.int64)
    for index, prefix in enumerate(prefixes):
        expected = np.frombuffer(prefix, dtype=np.uint8)
        hit = (which < 0) & np.all(padded[starts[:, None] + np.arange(len(expected))] == expected, axis=1)
        which[hit] = index
        after[hit] = starts[hit] + len(expected)
    if np.any(which < 0):
        first = int(np.flatnonzero(which < 0)[0])
        raise ValueError(f"record {first + 1} is not a record of this part's files")
    window = padded[after[:, None] + np.arange(_MAX_LINE_DIGITS + 2)].astype(np.int64)
    digit = (window >= 48) & (window <= 57)
    count = np.argmin(digit, axis=1)  # the first byte that is not a digit
    rows = np.arange(len(starts))
    well_formed = (
        (count >= 1)
        & (count <= _MAX_LINE_DIGITS)
        & (window[rows, count] == 44)  # `,`
        & (padded[after + count + 1] == 34)  # `"`: another field follows
        & ((window[:, 0] != 48) | (count == 1))  # no leading zero
    )
    if not np.all(well_formed):
        raise ValueError(f"record {int(np.flatnonzero(~well_formed)[0]) + 1} has no line number and fields after it")
    positions = np.arange(_MAX_LINE_DIGITS + 2)
    powers = np.where(positions < count[:, None], count[:, None] - 1 - positions, 0)
    numbers = np.where(positions < count[:, None], (window - 48) * (10**powers), 0).sum(axis=1)
    return which, numbers


# ------------------------------------------------------------------------------------------ Parquet


def parquet_table(sources: Sequence[str], source_of_row: np.ndarray, lines: np.ndarray, fields: dict[str, Any]) -> Any:
    """A Parquet part's table: `file` (dictionary-encoded), `line`, then a column per field (class names
    dictionary-encoded too)."""
    import pyarrow as pa

    # Numbers and names are built from numpy buffers (arrow_arrays.py), not `pa.array`, whose pandas bridge
    # imports pandas wherever it is installed.
    columns: dict[str, Any] = {
        "file": pa.DictionaryArray.from_arrays(from_numbers(source_of_row.astype(np.int32)), strings(sources)),
        "line": from_numbers(np.asarray(lines, dtype=np.int64)),
    }
    for name, column in fields.items():
        if isinstance(column, np.ndarray) and column.dtype.kind in "biuf" and column.ndim == 1:
            columns[name] = from_numbers(column)
        elif isinstance(column, np.ndarray) and column.dtype.kind in "biuf" and column.ndim == 2:
            flat = np.ascontiguousarray(column).reshape(-1)
            columns[name] = pa.FixedSizeListArray.from_arrays(from_numbers(flat), column.shape[1])
        elif isinstance(column, LabelColumn) and all(type(label) is str for label in column.names):
            # The class names as a dictionary column, as `file` is: each row's index and the names once. Built
            # as strings, a name per row, it took ~1.4 ms of a 50,000-row part, and the writer ~0.5 more to find
            # the repeats again; the file holds the same dictionary-encoded strings either way.
            indices = from_numbers(np.asarray(column.indices, dtype=np.int32))
            columns[name] = pa.DictionaryArray.from_arrays(indices, strings([str(label) for label in column.names]))
        elif name == "label" and isinstance(column, list) and all(type(label) is str for label in column):
            columns[name] = _names(column)  # names a row at a time (a hook's): the same type of column
        elif isinstance(column, LabelColumn):
            columns[name] = pa.array(list(column.names), type=pa.string()).take(pa.array(column.indices))
        elif (isinstance(column, np.ndarray) and column.dtype.kind in "OUS" and column.ndim == 1) or isinstance(
            column, list
        ):
            columns[name] = _typed(column.tolist() if isinstance(column, np.ndarray) else column)
        else:  # anything else keeps its JSON text
            cells, bracketed = json_cells(column)
            columns[name] = pa.array([b"[" + c + b"]" if bracketed else c for c in cells], type=pa.string())
    return pa.table(columns)


def _names(values: list[str]) -> Any:
    """Class names given one per row as a dictionary column: each name once, in the order they first appear."""
    import pyarrow as pa

    position: dict[str, int] = {}
    indices = np.fromiter((position.setdefault(value, len(position)) for value in values), np.int32, len(values))
    return pa.DictionaryArray.from_arrays(from_numbers(indices), strings(list(position)))


def _typed(values: list[Any]) -> Any:
    """Python values (class names, ids) as one typed Arrow column: string, int64, float64 or bool when every
    value is of that kind, else each value's JSON text."""
    import pyarrow as pa

    kinds = set(map(type, values))
    for kind, arrow_type in ((str, pa.string()), (int, pa.int64()), (bool, pa.bool_())):
        if kinds == {kind}:
            return pa.array(values, type=arrow_type)
    if kinds and kinds <= {int, float}:
        return pa.array(values, type=pa.float64())
    return pa.array([orjson.dumps(value, default=codecs.json_default).decode() for value in values], type=pa.string())


def parquet_bytes(tables: list[Any]) -> bytes:
    """The tables as one Parquet file; the same tables give the same bytes (no timestamps are written)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    sink = io.BytesIO()
    # Dictionary encoding only where values repeat (file names, class names): tried on every column (pyarrow's
    # default), it is given up on unique numbers only after the work, which made a part 60% larger and 2x slower
    # to write. Snappy (Parquet's usual codec): a 10,000-row part of breast-cancer's answers took 1.5 ms of CPU
    # to write against zstd's 2.6 ms, for 92 KB against 46 KB.
    repeating = [
        field.name for field in table.schema if pa.types.is_string(field.type) or pa.types.is_dictionary(field.type)
    ]
    # Integer columns delta-encoded (DELTA_BINARY_PACKED, an encoding of the Parquet format that readers of its
    # later encodings read): line numbers count up by one and take ~1 KB a part instead of 200 KB, class indices a
    # few bits a row. A 50,000-row part of breast-cancer's answers: 5.3 -> 4.6 ms to write, its check 1.7 -> 1.05 ms,
    # and the part, 55% smaller, is hashed and sent faster.
    integers = {field.name: "DELTA_BINARY_PACKED" for field in table.schema if pa.types.is_integer(field.type)}
    pq.write_table(table, sink, compression="snappy", use_dictionary=repeating, column_encoding=integers or None)
    return sink.getvalue()


def parquet_keys(body: bytes, sources: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(index into `sources`, line) of each row of a Parquet part; ValueError when a row has no prediction.

    Only `file` and `line` are read: that no response field has a null is told by the null counts the footer
    keeps for every column chunk (read when a writer left them out)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    reader = pq.ParquetFile(pa.BufferReader(body))
    names = reader.schema_arrow.names
    if len(names) < 3 or names[:2] != ["file", "line"]:
        raise ValueError(f"columns {names[:8]} are not file, line and the response fields")
    metadata = reader.metadata
    unknown: set[str] = set()
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            statistics = chunk.statistics
            if statistics is None or not statistics.has_null_count:
                unknown.add(chunk.path_in_schema.split(".")[0])
            elif statistics.null_count:
                raise ValueError("a row has a null")
    table = reader.read(columns=sorted(unknown | {"file", "line"}, key=names.index))
    if table.num_rows and any(table.column(name).null_count for name in table.column_names):
        raise ValueError("a row has a null")
    if table.num_rows != metadata.num_rows:
        raise ValueError(f"{table.num_rows} rows read, the footer says {metadata.num_rows}")
    position = {source: index for index, source in enumerate(sources)}
    file_column = table.column("file").combine_chunks()
    if pa.types.is_dictionary(file_column.type):
        named = [position.get(str(name), -1) for name in file_column.dictionary.to_pylist()]
        which = np.asarray(named, dtype=np.int64)[numbers(file_column.indices)]
    else:
        import pyarrow.compute as pc

        files = pc.cast(file_column, pa.string()).to_pylist()
        which = np.array([position.get(str(name), -1) for name in files], dtype=np.int64)
    if np.any(which < 0):
        raise ValueError("a row names a file that is not in this part")
    return which, numbers(table.column("line")).astype(np.int64)
