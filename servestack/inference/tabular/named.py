"""Batch rows by column name, for a model with named columns (servestack/inference/columns.py): JSON Lines of records
(or of rows by position, in the model's column order), CSV whose first line names the columns, and Parquet columns of
any type, strings included. Each format turns a piece's rows into `{column: values}` and `arrays_from_columns`
does the rest, as for the online request forms, so every format accepts and refuses the same values.

- Columns are matched by name, in any order. Columns the model does not take (an id, a target, a timestamp: a
  batch file usually holds more than the model reads) are left alone; a missing column is an error row that
  names it and lists the expected ones.
- With an id column (`id_column:` in serving.yaml), each good row's value of it comes back with the row's
  inputs, for the part to carry; a row without one is an error row. Rows by position (JSON lists, CSV without
  a header) have no named id and are refused when an id column is set.
- A batch whose values one row spoils is decoded again row by row, to name the bad rows; the others are scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servestack.inference import codecs, media_types
from servestack.inference.columns import arrays_from_columns, column_names, first_repeated
from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.runtime import Arrays
from servestack.inference.service import ServedModel
from servestack.inference.tabular.arrow_arrays import from_numbers, numbers
from servestack.inference.tabular.rows import Lines, Records

FIELD = "row"  # what a column's errors are named under: `row.<column>[0]`


@dataclass(frozen=True)
class Table:
    """The readable rows of a piece: `rows` (ascending indices into the piece) and each model column's values
    for them, in that order (a numpy array, or a list of Python values); `text`: the values are CSV cells."""

    rows: np.ndarray
    columns: dict[str, Any]
    text: bool = False


Named = tuple[np.ndarray, Arrays | None, list[tuple[int, ServingError]], list[Any] | None]


def decode_named(model: ServedModel, piece: Lines | Records, id_column: str | None) -> Named | None:
    """(indices of the good rows, their arrays, the bad rows, each good row's id with an id column) for the
    piece's rows read by column name; None when the piece holds the model's inputs by tensor instead (a Parquet
    file with a column per input, CSV without a header): the tensor path reads it."""
    names = column_names(model.manifest)
    bad: list[tuple[int, ServingError]] = []
    ids: dict[int, Any] = {}
    table = _table(piece, names, id_column, bad, ids)
    if table is None:
        return None
    good, arrays = _decode(model, table, bad)
    kept = None if id_column is None else [ids[index] for index in good.tolist()]
    return good, arrays, sorted(bad, key=lambda pair: pair[0]), kept


def _table(
    piece: Lines | Records,
    names: list[str],
    id_column: str | None,
    bad: list[tuple[int, ServingError]],
    ids: dict[int, Any],
) -> Table | None:
    if isinstance(piece, Records):
        return _parquet_table(piece, names, id_column, bad, ids)
    if piece.media_type == media_types.JSON:
        return _json_table(piece, names, id_column, bad, ids)
    if piece.header is not None:
        return _csv_table(piece, names, id_column, bad, ids)
    if id_column is not None:
        error = InvalidInput(
            f"{piece.source}: a CSV file without a header has no column {id_column!r} (id_column)",
            field="id_column",
            value=id_column,
            allowed=f"a first line naming the columns: {', '.join([id_column, *names])}",
        )
        bad.extend((index, error) for index in range(len(piece)))
        return _empty(names)
    return None


def _empty(names: list[str]) -> Table:
    return Table(np.empty(0, dtype=np.int64), {name: [] for name in names})


def _missing(names: list[str], missing: str) -> InvalidInput:
    return InvalidInput(
        f"{FIELD}: missing column {missing!r}; the model takes the columns {names}",
        field=FIELD,
        value=missing,
        allowed=", ".join(names),
    )


def _from_rows(names: list[str], rows: dict[int, list[Any]], *, text: bool) -> Table:
    order = sorted(rows)
    columns = {name: [rows[index][position] for index in order] for position, name in enumerate(names)}
    return Table(np.array(order, dtype=np.int64), columns, text)


def _json_table(
    lines: Lines, names: list[str], id_column: str | None, bad: list[tuple[int, ServingError]], ids: dict[int, Any]
) -> Table:
    rows: dict[int, list[Any]] = {}
    for index in range(len(lines)):
        try:
            value = codecs.decode_body(lines.raw(index), media_types.JSON)
            rows[index], ident = _json_row(value, names, id_column)
        except ServingError as error:
            bad.append((index, error))
            continue
        if id_column is not None:
            ids[index] = ident
    return _from_rows(names, rows, text=False)


def _json_row(value: Any, names: list[str], id_column: str | None) -> tuple[list[Any], Any]:
    """One JSON line: an object of column to value (any order, other keys ignored), or a list by position."""
    if type(value) is dict:
        if id_column is not None and value.get(id_column) is None:
            raise _missing([id_column, *names], id_column) if id_column not in value else _null_id(id_column)
        missing = next((name for name in names if name not in value), None)
        if missing is not None:
            raise _missing(names, missing)
        return [value[name] for name in names], value.get(id_column) if id_column is not None else None
    if type(value) is list and id_column is None and len(value) == len(names):
        return value, None
    raise InvalidInput(
        f"{FIELD}: expected an object of column name to value"
        + ("" if id_column is not None else f", or a list of {len(names)} values in column order"),
        field=FIELD,
        value=type(value).__name__,
        allowed='{"' + '": ..., "'.join(([id_column] if id_column else []) + names) + '": ...}',
    )


def _csv_table(
    lines: Lines, names: list[str], id_column: str | None, bad: list[tuple[int, ServingError]], ids: dict[int, Any]
) -> Table:
    header = list(lines.header or ())
    position_of = {name: position for position, name in enumerate(header)}  # one pass: no scan per name
    wanted = ([id_column] if id_column is not None else []) + names
    missing = next((name for name in wanted if name not in position_of), None)
    twice = first_repeated(header)
    if missing is not None or twice is not None:
        error = (
            _missing(wanted, missing)
            if missing is not None
            else InvalidInput(
                f"{lines.source} header: {twice!r} is named twice", field="header", value=twice, allowed="unique names"
            )
        )
        bad.extend((index, error) for index in range(len(lines)))
        return _empty(names)
    positions = [position_of[name] for name in names]
    id_position = position_of[id_column] if id_column is not None else -1
    rows: dict[int, list[Any]] = {}
    for index in range(len(lines)):
        try:
            parsed = codecs.decode_body(lines.raw(index), media_types.CSV)
        except ServingError as error:
            bad.append((index, error))
            continue
        if len(parsed) != 1 or len(parsed[0]) != len(header):
            cells = len(parsed[0]) if len(parsed) == 1 else f"{len(parsed)} rows"
            message = f"line: {cells} cells, the header names {len(header)} ({', '.join(header[:8])})"
            bad.append((index, InvalidInput(message, field="line", value=cells, allowed=f"{len(header)} cells")))
            continue
        rows[index] = [parsed[0][position] for position in positions]
        if id_column is not None:
            ids[index] = parsed[0][id_position]
    return _from_rows(names, rows, text=True)


def _parquet_table(
    records: Records, names: list[str], id_column: str | None, bad: list[tuple[int, ServingError]], ids: dict[int, Any]
) -> Table | None:
    batch = records.batch
    present = set(batch.schema.names)
    if id_column is None and any(name not in present for name in names):
        return None  # a column per model input, or one per value of a row: the tensor path's layouts
    wanted = ([id_column] if id_column is not None else []) + names
    missing = next((name for name in wanted if name not in present), None)
    if missing is not None:
        error = _missing(wanted, missing)
        bad.extend((index, error) for index in range(len(records)))
        return _empty(names)
    rows = np.arange(len(records), dtype=np.int64)
    columns = {name: _arrow_values(batch.column(name)) for name in names}
    if id_column is not None:
        values = batch.column(id_column).to_pylist()
        nulls = [index for index, value in enumerate(values) if value is None]
        bad.extend((index, _null_id(id_column)) for index in nulls)
        ids.update(enumerate(values))
        if nulls:
            rows = np.delete(rows, nulls)
            columns = {
                name: column[rows] if isinstance(column, np.ndarray) else [column[i] for i in rows.tolist()]
                for name, column in columns.items()
            }
    return Table(rows, columns)


def _null_id(id_column: str) -> InvalidInput:
    return InvalidInput(
        f"{id_column}: null; every row needs its id (id_column)",
        field=id_column,
        value=None,
        allowed="a value in every row",
    )


def _arrow_values(column: Any) -> Any:
    """A Parquet column's values: numbers as a numpy array, strings read as a dictionary (parquet_reading.py) as an
    object array of references to one `str` per distinct value (no Python object per row: a string repeated
    300,000 times is one object); anything else (a column with nulls, other types) as Python values, which
    `arrays_from_columns` checks one by one."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_dictionary(kind):
        return _dictionary_values(column)
    numeric = pa.types.is_floating(kind) or pa.types.is_integer(kind) or pa.types.is_boolean(kind)
    if numeric and not column.null_count:
        return numbers(column)  # a view of the column's buffer (arrow_arrays.py: no pandas bridge)
    return column.to_pylist()


def _dictionary_values(column: Any) -> np.ndarray:
    """A dictionary column as an object array: each distinct value used converted once, nulls as None."""
    import pyarrow.compute as pc

    indices = numbers(pc.fill_null(column.indices, 0) if column.indices.null_count else column.indices)
    used, positions = np.unique(indices, return_inverse=True)
    if not len(used):
        return np.empty(0, dtype=object)
    values = np.empty(len(used), dtype=object)
    values[:] = column.dictionary.take(from_numbers(used)).to_pylist()
    picked: np.ndarray = values[positions.reshape(-1)]
    if column.null_count:
        picked[column.is_null().to_numpy(zero_copy_only=False)] = None
    return picked


def _decode(model: ServedModel, table: Table, bad: list[tuple[int, ServingError]]) -> tuple[np.ndarray, Arrays | None]:
    """(indices of the rows that decoded, their arrays); rows that do not decode are added to `bad`."""
    if not len(table.rows):
        return np.empty(0, dtype=np.int64), None
    try:
        return table.rows, _arrays(model, table, slice(None))
    except ServingError:
        pass
    good: list[int] = []
    for position, index in enumerate(table.rows.tolist()):
        try:
            _arrays(model, table, slice(position, position + 1))
            good.append(position)
        except ServingError as error:
            bad.append((index, error))
    if not good:
        return np.empty(0, dtype=np.int64), None
    chosen = np.array(good, dtype=np.int64)
    return table.rows[chosen], _arrays(model, table, chosen)


def _arrays(model: ServedModel, table: Table, rows: slice | np.ndarray) -> Arrays:
    columns = {
        name: values[rows] if isinstance(values, np.ndarray) else _pick(values, rows)
        for name, values in table.columns.items()
    }
    return arrays_from_columns(model.manifest, columns, field=FIELD, text=table.text)


def _pick(values: list[Any], rows: slice | np.ndarray) -> list[Any]:
    return values[rows] if isinstance(rows, slice) else [values[index] for index in rows.tolist()]
