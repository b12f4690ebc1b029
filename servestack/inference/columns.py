"""Named columns of a tabular model: which columns it takes, and how columns of values become its input arrays.

A model's columns are its manifest's `columns`, else one column per ONNX input of shape `[N, 1]` (how skl2onnx
converts a DataFrame pipeline), else none: the model is not tabular and takes only tensor requests. Every
row-by-name request form (JSON records, `dataframe_split`, columnar `inputs`, CSV with a header, batch files)
turns its rows into `{column name: values}` first, and `arrays_from_columns` does the rest, so each form
accepts and refuses exactly the same values, with the same messages.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from servestack.inference.column_plan import SQUARED_MAX, ConversionPlan, conversion_plan, planned_arrays
from servestack.inference.errors import InvalidInput, short_repr, unconvertible
from servestack.inference.manifest import ColumnSpec, Manifest, TensorSpec, numpy_dtype_of

Arrays = dict[str, np.ndarray]
Columns = dict[str, Any]  # column name -> a list (or 1-D array) of its values, one per row

_NONE = type(None)
_FLOAT_TYPES = frozenset({int, float})
_FLOAT_OR_NULL = frozenset({int, float, _NONE})
# A CSV cell read as a number: a plain ASCII decimal (float() alone would also take `1_0` or `١٢`). Each run of
# digits matches one way only, so a match costs time linear in the cell (`\d+\.?\d*` could split a run
# anywhere: a cell of 40,000 digits and an `x` took 50 s to refuse).
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|infinity)", re.I | re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)
_NAN_CELLS = frozenset({"", "nan", "NaN", "NAN", "null", "NA"})
_BOOLEAN_CELLS = {"true": True, "false": False, "1": True, "0": False}
# A CSV integer cell longer than this is past int64 whatever its digits (19 digits and a sign, leading zeros
# aside): refused without `int()`, which costs quadratic time in the digits and raises ValueError past 4,300.
_INT64_DIGITS = 19
_NameT = TypeVar("_NameT", bound=Hashable)


def first_repeated(names: Sequence[_NameT]) -> _NameT | None:
    """The first name met a second time, or None: one pass with a set, so a request of 30,000 column names
    costs 30,000 lookups (`names.count(name)` per name cost 900 million comparisons, seconds on the loop)."""
    if len(set(names)) == len(names):  # the usual answer, in one C-level pass
        return None
    seen: set[_NameT] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


@functools.lru_cache(maxsize=256)
def columns_of(manifest: Manifest) -> tuple[ColumnSpec, ...]:
    """The manifest's declared columns; else one per input when every input is `[N, 1]`; else () (not tabular)."""
    if manifest.columns is not None:
        return manifest.columns
    if all(_is_column(spec) for spec in manifest.inputs):
        return tuple(
            ColumnSpec(spec.name, spec.dtype, spec.name, allow_nan=manifest.allow_non_finite and _is_float(spec))
            for spec in manifest.inputs
        )
    return ()


def column_names(manifest: Manifest) -> list[str]:
    return [column.name for column in columns_of(manifest)]


def _is_column(spec: TensorSpec) -> bool:
    return len(spec.shape) == 2 and spec.shape[1] == 1


def _is_float(spec: TensorSpec | ColumnSpec) -> bool:
    return spec.dtype.startswith("float")


# ------------------------------------------------------------------------------------------ forms -> columns


def columns_from_records(rows: Any, *, field: str) -> Columns:
    """`[{column: value, ...}, ...]` (JSON records, row objects) -> columns. Every row names the same columns."""
    if type(rows) is not list or not rows:
        raise InvalidInput(
            f"{field}: expected a non-empty list of row objects, got {short_repr(rows)}",
            field=field,
            value=rows,
            allowed='[{"<column>": value, ...}, ...]',
        )
    first = rows[0]
    if type(first) is not dict:
        raise _not_a_record(field, 0, first)
    keys = first.keys()
    for number, row in enumerate(rows):
        if type(row) is not dict:
            raise _not_a_record(field, number, row)
        if row.keys() != keys:
            missing = sorted(set(keys) - set(row))
            extra = sorted(set(row) - set(keys))
            named = missing[0] if missing else extra[0]
            raise InvalidInput(
                f"{field}[{number}]: {'has no' if missing else 'has an extra'} column {named!r}; "
                f"every row needs the same columns as the first, {sorted(keys)}",
                field=f"{field}[{number}]",
                value=named,
                allowed=", ".join(sorted(keys)),
            )
    return {key: [row[key] for row in rows] for key in keys}


def _not_a_record(field: str, number: int, row: Any) -> InvalidInput:
    return InvalidInput(
        f"{field}[{number}]: expected an object of column name to value, got {type(row).__name__}",
        field=f"{field}[{number}]",
        value=row,
        allowed='{"<column>": value, ...}',
    )


_SPLIT_KEYS = frozenset({"columns", "data", "index"})
_TEXT = frozenset({str})


def columns_from_split(split: Any, *, field: str) -> Columns:
    """`{"columns": [...], "data": [[...], ...], "index": [...] (optional)}` (pandas' `orient="split"`) -> columns."""
    if type(split) is not dict or "columns" not in split or "data" not in split:
        raise InvalidInput(
            f"{field}: expected an object with 'columns' and 'data'",
            field=field,
            value=sorted(split)[:5] if type(split) is dict else type(split).__name__,
            allowed='{"columns": ["<name>", ...], "data": [[...], ...], "index": [...] (optional)}',
        )
    unknown = [] if split.keys() <= _SPLIT_KEYS else sorted(set(split) - _SPLIT_KEYS)
    if unknown:
        raise InvalidInput(
            f"{field}: unknown key {unknown[0]!r}", field=field, value=unknown[0], allowed="columns, data, index"
        )
    names = split["columns"]
    if type(names) is not list or not set(map(type, names)) <= _TEXT:
        raise InvalidInput(
            f"{field}.columns: expected a list of column names",
            field=f"{field}.columns",
            value=names,
            allowed="a list of strings",
        )
    twice = first_repeated(names)
    if twice is not None:
        raise InvalidInput(
            f"{field}.columns: {twice!r} is named twice", field=f"{field}.columns", value=twice, allowed="unique names"
        )
    index = split.get("index")
    data = split["data"]
    if index is not None and (type(index) is not list or type(data) is not list or len(index) != len(data)):
        raise InvalidInput(
            f"{field}.index: expected one label per row of data",
            field=f"{field}.index",
            value=short_repr(index),
            allowed="a list as long as data",
        )
    return columns_from_rows(names, data, field=f"{field}.data")


def columns_from_rows(names: Sequence[str], rows: Any, *, field: str) -> Columns:
    """Rows of values in the order of `names` (a `dataframe_split`'s data, positional `instances`) -> columns."""
    if type(rows) is not list or not rows:
        raise InvalidInput(
            f"{field}: expected a non-empty list of rows",
            field=field,
            value=short_repr(rows),
            allowed=f"rows of {len(names)} values: {', '.join(names)}",
        )
    width = len(names)
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {width}:
        number, row = next((n, r) for n, r in enumerate(rows) if type(r) is not list or len(r) != width)
        raise InvalidInput(
            f"{field}[{number}]: expected a row of {width} values ({', '.join(names)}), got {short_repr(row)}",
            field=f"{field}[{number}]",
            value=row,
            allowed=f"{width} values",
        )
    # Each column a tuple: one C-level transpose (every row's width is checked just above, so no `strict`).
    return dict(zip(names, zip(*rows, strict=False), strict=False))


def columns_from_csv(rows: list[list[str]], manifest: Manifest, *, header: bool | None, field: str = "csv") -> Columns:
    """CSV rows of cells -> columns of cells (still text: `arrays_from_columns(..., text=True)` reads them). With
    `header` True the first row names the columns; None: it does when it holds exactly the column names (in any
    order); False: no header, the cells are in the model's column order."""
    names = column_names(manifest)
    if not rows:
        raise InvalidInput("empty batch: send at least one row", field=field, value=[], allowed="1 or more rows")
    first = [cell.strip(" \t") for cell in rows[0]]
    if header or (header is None and len(first) == len(names) and set(first) == set(names)):
        twice = first_repeated(first)
        if twice is not None:
            raise InvalidInput(
                f"{field} header: {twice!r} is named twice",
                field=f"{field} header",
                value=twice,
                allowed=", ".join(names),
            )
        names, rows = first, rows[1:]
    if not rows:
        raise InvalidInput("empty batch: send at least one row", field=field, value=[], allowed="1 or more rows")
    width = len(names)
    for number, cells in enumerate(rows, start=1):
        if len(cells) != width:
            raise InvalidInput(
                f"{field} line {number}: {len(cells)} cells, expected {width} ({', '.join(names)})",
                field=f"{field} line {number}",
                value=f"{len(cells)} cells",
                allowed=f"{width} cells",
            )
    return {name: [cells[position] for cells in rows] for position, name in enumerate(names)}


# ------------------------------------------------------------------------------------------ columns -> arrays


def arrays_from_columns(
    manifest: Manifest,
    columns: Mapping[str, np.ndarray | Sequence[Any]],
    *,
    field: str,
    max_rows: int | None = None,
    text: bool = False,
) -> dict[str, np.ndarray]:
    """`{column: values}` (any order) -> the model's input arrays: `[N, 1]` inputs, or a `[N, k]` input in column
    order. Each column is cast to its dtype (strings stay an object array of str); NaN (or `null`/None, or an
    empty or `NaN` cell with `text`) only where the column allows it. `text`: the values are CSV cells.
    Raises `InvalidInput` naming the column (and listing the expected ones when one is missing or unknown);
    a ValueError or OverflowError of a conversion that no check named first is `InvalidInput` too."""
    try:
        if not text:
            fast = planned_arrays(_plan_of(manifest), columns, max_rows)
            if fast is not None:
                return fast
        return arrays_column_by_column(manifest, columns, field=field, max_rows=max_rows, text=text)
    except (ValueError, OverflowError) as error:
        raise unconvertible(field, error) from None


# The last manifest planned and its plan: hashing a manifest for the plan's cache costs more than the rest of
# the lookup, and a worker usually serves one model.
_last_plan: tuple[Manifest, ConversionPlan] | None = None


def _plan_of(manifest: Manifest) -> ConversionPlan:
    global _last_plan
    last = _last_plan  # read once: another thread may replace it meanwhile
    if last is None or last[0] is not manifest:
        last = _last_plan = (manifest, conversion_plan(manifest, columns_of(manifest)))
    return last[1]


def arrays_column_by_column(
    manifest: Manifest,
    columns: Mapping[str, np.ndarray | Sequence[Any]],
    *,
    field: str,
    max_rows: int | None = None,
    text: bool = False,
) -> dict[str, np.ndarray]:
    """`arrays_from_columns` without its shortcut for plainly valid JSON columns: each column checked and cast
    alone, and the first problem named. Every refusal comes from here; the shortcut returns the same arrays
    for what it takes (tests/unit/test_column_conversion.py holds the two equal)."""
    specs = columns_of(manifest)
    expected = [column.name for column in specs]
    if not specs:
        raise InvalidInput(
            f"{field}: model {manifest.key} has no named columns; send tensors as "
            f"{{'instances': [[...]]}} or {{'inputs': {{'<input>': [[...]]}}}}",
            field=field,
            value=sorted(columns)[:8],
            allowed="instances or inputs (push the model with --columns a,b,... to name the columns of its input)",
        )
    known = set(expected)
    if columns.keys() != known:
        missing = [name for name in expected if name not in columns]
        unknown = sorted(name for name in columns if name not in known)
        named, problem = (missing[0], "missing column") if missing else (unknown[0], "unknown column")
        raise InvalidInput(
            f"{field}: {problem} {named!r}; the model takes the columns {expected}",
            field=f"{field}.{named}" if problem == "unknown column" else field,
            value=named,
            allowed=", ".join(expected),
        )
    values: dict[str, np.ndarray] = {}
    rows: int | None = None
    for column in specs:
        raw = columns[column.name]
        if not isinstance(raw, list | tuple | np.ndarray):
            raise InvalidInput(
                f"{field}.{column.name}: expected a list of values, one per row, got {type(raw).__name__}",
                field=f"{field}.{column.name}",
                value=raw,
                allowed=f"a list of {column.dtype} values",
            )
        count = len(raw)
        if rows is None:
            rows = count
            if max_rows is not None and rows > max_rows:
                raise InvalidInput(
                    f"batch of {rows} rows is over the limit", field=field, value=rows, allowed=f"1..{max_rows} rows"
                )
        elif count != rows:
            raise InvalidInput(
                f"{field}.{column.name}: {count} values, column {expected[0]!r} has {rows}; every column needs "
                f"one value per row",
                field=f"{field}.{column.name}",
                value=count,
                allowed=f"{rows} values",
            )
        where = f"{field}.{column.name}"
        values[column.name] = (
            _text_column(column, list(raw), where, manifest) if text else _column(column, raw, where, manifest)
        )
    if not rows:
        raise InvalidInput("empty batch: send at least one row", field=field, value=[], allowed="1 or more rows")
    return _assemble(manifest, specs, values)


def _assemble(manifest: Manifest, specs: tuple[ColumnSpec, ...], values: dict[str, np.ndarray]) -> Arrays:
    feeding: dict[str, list[ColumnSpec]] = {}
    for column in specs:
        feeding.setdefault(column.input, []).append(column)
    arrays: dict[str, np.ndarray] = {}
    for spec in manifest.inputs:
        fed = feeding[spec.name]
        if len(fed) == 1:
            arrays[spec.name] = values[fed[0].name].reshape(-1, 1)
        else:
            ordered = sorted(fed, key=lambda column: column.index or 0)
            arrays[spec.name] = np.stack([values[column.name] for column in ordered], axis=1)
    return arrays


def _column(column: ColumnSpec, raw: Any, field: str, manifest: Manifest) -> np.ndarray:
    """One column of JSON values (or a 1-D array, from a hook or a Parquet file) as a 1-D array of its dtype."""
    if isinstance(raw, np.ndarray):
        if raw.ndim == 2 and raw.shape[1] == 1:
            raw = raw.reshape(-1)
        if raw.ndim != 1:
            raise InvalidInput(
                f"{field}: an array of shape {list(raw.shape)}; a column is one value per row",
                field=field,
                value=f"shape {list(raw.shape)}",
                allowed="a 1-D array",
            )
        if raw.dtype.kind == "O" or (column.dtype == "string" and raw.dtype.kind == "U"):
            raw = raw.tolist()
        elif column.dtype == "string" or raw.dtype.kind not in _KINDS[column.dtype[0]]:
            raise InvalidInput(
                f"{field}: an array of {raw.dtype.name}; column {column.name!r} takes {column.dtype}",
                field=field,
                value=raw.dtype.name,
                allowed=column.dtype,
            )
        else:
            return _checked_numbers(column, raw, field, manifest)
    kinds = set(map(type, raw))
    if column.dtype == "string":
        if kinds <= {str}:
            return np.array(raw, dtype=object)
        raise _bad_value(column, raw, field, lambda value: type(value) is str, "strings")
    if column.dtype == "bool":
        if kinds <= {bool, np.bool_}:
            return np.array(raw, dtype=bool)
        raise _bad_value(column, raw, field, lambda value: isinstance(value, bool | np.bool_), "true or false")
    integers = column.dtype[0] in "iu"
    allowed = {int} if integers else (_FLOAT_OR_NULL if column.allow_nan else _FLOAT_TYPES)
    if not kinds <= allowed:
        wanted = "integers" if integers else ("numbers, NaN or null" if column.allow_nan else "numbers")
        raise _bad_value(column, raw, field, lambda value: type(value) in allowed, wanted)
    try:
        array = np.array(raw, dtype=np.int64 if integers else np.float64)
    except OverflowError:
        if integers:
            raise _bad_value(column, raw, field, lambda v: _INT64_MIN <= v <= _INT64_MAX, _INT64_CELLS) from None
        raise _bad_value(column, raw, field, lambda v: type(v) is not int or abs(v) < 2**1024, "numbers") from None
    return _checked_numbers(column, array, field, manifest)


_KINDS = {"f": "fiu", "i": "iu", "u": "u", "b": "b"}


def _checked_numbers(column: ColumnSpec, array: np.ndarray, field: str, manifest: Manifest) -> np.ndarray:
    """Cast to the column's dtype: NaN only where allowed, infinities only with `allow_non_finite`, every value
    within the dtype's range."""
    target = numpy_dtype_of(column.dtype)
    # The common column, at the cost of one call: a sum of squares within the dtype's largest value squared
    # proves every value finite (NaN and infinity make it fail) and within range. Past it: look closer.
    fits = target.kind == "f" and array.dtype.char in "fd" and float(np.vdot(array, array)) <= SQUARED_MAX[target.char]
    if fits:
        return array.astype(target, copy=False)
    if target.kind in "iu" and array.dtype.kind in "iu":
        info = np.iinfo(target)
        outside = np.flatnonzero((array < info.min) | (array > info.max))
        if len(outside):
            row = int(outside[0])
            raise InvalidInput(
                f"{field}[{row}]: {array[row]} does not fit column {column.name!r} ({column.dtype})",
                field=f"{field}[{row}]",
                value=int(array[row]),
                allowed=f"integers {info.min}..{info.max}",
            )
        return array.astype(target, copy=False)
    if target.kind == "f" and array.dtype.kind == "f":
        nan = np.isnan(array)
        if not column.allow_nan and nan.any():
            row = int(np.flatnonzero(nan)[0])
            raise InvalidInput(
                f"{field}[{row}]: NaN is not allowed; column {column.name!r} takes numbers (push the model with "
                f"--allow-nan {column.name} if it handles missing values)",
                field=f"{field}[{row}]",
                value="NaN",
                allowed=f"{column.dtype} numbers",
            )
        limit = float(np.finfo(target).max)
        with np.errstate(invalid="ignore"):
            beyond = np.abs(array) > limit
        if beyond.any() and not manifest.allow_non_finite:
            row = int(np.flatnonzero(beyond)[0])
            raise InvalidInput(
                f"{field}[{row}]: {float(array[row])!r} does not fit column {column.name!r} ({column.dtype})",
                field=f"{field}[{row}]",
                value=str(float(array[row])),
                allowed=f"finite numbers within +-{limit:.4g}",
            )
        with np.errstate(over="ignore"):
            return array.astype(target, copy=False)
    return array.astype(target, copy=False)


def _bad_value(column: ColumnSpec, raw: Sequence[Any], field: str, fits: Any, wanted: str) -> InvalidInput:
    row = next(number for number, value in enumerate(raw) if not fits(value))
    value = raw[row]
    shown = "NaN" if isinstance(value, float) and math.isnan(value) else short_repr(value)
    if value is None or shown == "NaN":
        hint = f" (push the model with --allow-nan {column.name} if it handles missing values)"
        message = f"{field}[{row}]: a missing value is not allowed; column {column.name!r} takes {wanted}"
        message += hint if _is_float(column) else ""
    else:
        message = f"{field}[{row}]: {shown} ({type(value).__name__}) is not allowed; "
        message += f"column {column.name!r} takes {wanted}"
    return InvalidInput(message, field=f"{field}[{row}]", value=value, allowed=f"{column.dtype} {wanted}")


def _text_column(column: ColumnSpec, cells: Sequence[str], field: str, manifest: Manifest) -> np.ndarray:
    """One column of CSV cells: strings as they are; numbers as plain ASCII decimals; an empty or `NaN` cell is
    NaN (allowed only where the column allows it); booleans as true/false/1/0."""
    if column.dtype == "string":
        return np.array(cells, dtype=object)
    values: list[Any] = []
    integers, booleans = column.dtype[0] in "iu", column.dtype == "bool"
    for row, cell in enumerate(cells):
        text = cell.strip(" \t")
        if booleans:
            found = _BOOLEAN_CELLS.get(text.lower())
            if found is None:
                raise _bad_cell(column, field, row, text, "true, false, 1 or 0")
            values.append(found)
        elif integers:
            if _INTEGER.fullmatch(text) is None:
                raise _bad_cell(column, field, row, text, "integers")
            if len(text) > _INT64_DIGITS + 1:  # `int` would count leading zeros towards its limit too
                digits = text.lstrip("+-").lstrip("0")
                if len(digits) > _INT64_DIGITS:
                    raise _bad_cell(column, field, row, text, _INT64_CELLS)
                text = ("-" if text[0] == "-" else "") + (digits or "0")
            values.append(int(text))
        elif text in _NAN_CELLS:
            values.append(math.nan)
        elif _DECIMAL.fullmatch(text) is not None:
            values.append(float(text))  # any length: float() reads 5,000 digits as inf, which is checked below
        else:
            raise _bad_cell(column, field, row, text, "numbers (ASCII decimal, e.g. -1.5e3; empty or NaN: missing)")
    if booleans:
        return np.array(values, dtype=bool)
    try:
        array = np.array(values, dtype=np.int64 if integers else np.float64)
    except OverflowError:  # an integer of 19 digits past int64's range: name it
        past = next(row for row, value in enumerate(values) if not _INT64_MIN <= value <= _INT64_MAX)
        raise _bad_cell(column, field, past, cells[past].strip(" \t"), _INT64_CELLS) from None
    return _checked_numbers(column, array, field, manifest)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT64_CELLS = f"integers of at most 19 digits (within {_INT64_MIN}..{_INT64_MAX})"


def _bad_cell(column: ColumnSpec, field: str, row: int, text: str, wanted: str) -> InvalidInput:
    return InvalidInput(
        f"{field}[{row}]: {text[:40]!r} is not allowed; column {column.name!r} takes {wanted}",
        field=f"{field}[{row}]",
        value=text,
        allowed=f"{column.dtype} {wanted}",
    )
