"""Validation of a request's raw input values against the manifest: each becomes an array of the input's
dtype and shape, or an `InvalidInput` that names the field, the value and what is allowed.

A whole batch is checked at once as an array (row count, shape, dtype, range, finiteness); only when that
fails are the rows walked to find and name the first offending element (`_explain`). JSON `true`/`false` are
never read as 1/0 by a numeric input, and CSV cells are plain ASCII decimals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from servestack.inference.codecs import Arrays
from servestack.inference.errors import InvalidInput, short_repr
from servestack.inference.manifest import Manifest, SequenceInput, TensorSpec
from servestack.inference.media_types import CSV


def validate_inputs(
    raw: Mapping[str, tuple[str, Any]], manifest: Manifest, *, max_batch_rows: int, may_hold_booleans: bool = True
) -> Arrays:
    """Turn raw values into arrays of the manifest's dtype and shape, or raise `InvalidInput`. Row counts and
    shapes are checked before anything is converted. `may_hold_booleans=False` only when the body is known to
    have no JSON `true`/`false` in it."""
    expected = {spec.name: spec for spec in manifest.inputs}
    if raw.keys() != expected.keys():
        unknown = sorted(set(raw) - set(expected))
        missing = sorted(set(expected) - set(raw))
        raise InvalidInput(
            f"inputs: unknown {unknown[:8]} / missing {missing}",
            field="inputs",
            value=sorted(raw)[:8],
            allowed=str(sorted(expected)),
        )
    arrays = {
        name: _to_array(field, value, expected[name], manifest, max_batch_rows, may_hold_booleans)
        for name, (field, value) in raw.items()
    }
    for entry in manifest.sequences:
        if entry.input in arrays:
            check_sequence_bounds(raw[entry.input][0], arrays[entry.input], entry)
    batch_sizes = {name: array.shape[0] for name, array in arrays.items()}
    if len(batch_sizes) > 1 and len(set(batch_sizes.values())) > 1:
        raise InvalidInput(
            f"inputs: every input needs the same number of rows, got {batch_sizes}",
            field="inputs",
            value=batch_sizes,
            allowed="equal row counts",
        )
    rows = next(iter(batch_sizes.values()))
    if rows == 0:
        raise InvalidInput("empty batch: send at least one row", field="instances", value=[], allowed="1 or more rows")
    return arrays


NUMERIC_KINDS = {"f": "fiu", "i": "iu", "u": "u", "b": "b"}
_SEQUENCES = (list, np.ndarray)


def _check_rows(field: str, rows: int, max_rows: int) -> None:
    if rows > max_rows:
        raise InvalidInput(
            f"batch of {rows} rows is over the limit",
            field="instances" if field == "csv" else field,
            value=rows,
            allowed=f"1..{max_rows} rows",
        )


def _to_array(
    field: str, value: Any, spec: TensorSpec, manifest: Manifest, max_rows: int, may_hold_booleans: bool
) -> np.ndarray:
    """Validate one input as a whole array; walk the elements only to explain a failure."""
    if field == "csv":
        return _csv_to_array(value, spec, manifest, max_rows)
    if not isinstance(value, _SEQUENCES):
        raise InvalidInput(
            f"{field}: expected a list of rows, got {type(value).__name__}",
            field=field,
            value=value,
            allowed=f"rows of shape {_shape_text(spec.row_shape)}",
        )
    target = spec.numpy_dtype
    if isinstance(value, np.ndarray):  # .npy (or a hook's array): dtype and shape first, then the one copy
        _check_rows(field, value.shape[0] if value.ndim else 1, max_rows)
        if spec.dtype == "string" and value.dtype.kind in "UO":  # a hook's strings, any `<U` width or objects
            return _string_array(field, value, spec)
        if spec.dtype == "string" or value.dtype.kind not in NUMERIC_KINDS[target.kind]:
            raise InvalidInput(
                f"{field}: an array of {value.dtype.name}; input {spec.name!r} takes {spec.dtype}",
                field=field,
                value=value.dtype.name,
                allowed=f"{spec.dtype} (or a dtype that converts to it without loss of kind)",
            )
        _check_shape(field, value, spec)
        return _cast(field, value, target, manifest)
    _check_rows(field, len(value), max_rows)
    sequence = manifest.sequence_of(spec.name) if manifest.sequences else None
    if sequence is not None:
        value = padded_rows(field, value, spec, sequence)
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):  # ragged or too deep: numpy refuses to build the array
        raise _explain(field, value, spec) from None
    if array.dtype == object:
        raise _explain(field, value, spec)
    if spec.dtype == "string":
        if array.dtype.kind != "U":
            raise _explain(field, value, spec)
        array = array.astype(object)
    elif array.dtype.kind not in NUMERIC_KINDS[target.kind]:
        raise _explain(field, value, spec)
    _check_shape(field, array, spec)
    if may_hold_booleans and target.kind != "b" and array.dtype.kind in "iuf":
        # np.asarray([1, True]) is [1, 1]: a boolean among numbers must be found by looking at each element.
        problem = _find_problem(field, value, spec)
        if problem is not None:
            raise problem
    if spec.dtype != "string":
        array = _cast(field, array, target, manifest)
    return array


def padded_rows(field: str, rows: list[Any], spec: TensorSpec, sequence: SequenceInput) -> list[Any]:
    """The rows of a sequence input with each row's length checked against `max_length` (the row is named) and,
    where the manifest declares a pad value, the shorter rows padded at their end to the longest (or to the
    graph's fixed length). Anything that is not a list of lists is returned as it is, for the checks that follow
    to name."""
    lengths = [len(row) if type(row) is list else -1 for row in rows]
    if not lengths or min(lengths) < 0:
        return rows
    longest = max(lengths)
    if sequence.max_length is not None and longest > sequence.max_length:
        row = lengths.index(longest)
        raise InvalidInput(
            f"{field}[{row}]: row {row} of input {spec.name!r} holds {longest} values, past its maximum length "
            f"{sequence.max_length}",
            field=f"{field}[{row}]",
            value=longest,
            allowed=f"at most {sequence.max_length} values",
        )
    target = spec.row_shape[0] or longest
    if sequence.pad is None or all(length == target for length in lengths) or longest > target:
        return rows  # nothing to pad, or a row too long for the fixed length: the shape check names it
    pad = [sequence.pad]
    return [row if len(row) == target else row + pad * (target - len(row)) for row in rows]


def check_sequence_bounds(field: str, array: np.ndarray, sequence: SequenceInput) -> None:
    """Refuse a sequence longer than `max_length` or an id outside `ids`, naming the input's row (whatever form
    carried it: the rows were checked before padding; an `.npy` array or a hook's output is checked here)."""
    if array.ndim != 2:
        return
    if sequence.max_length is not None and array.shape[1] > sequence.max_length:
        raise InvalidInput(
            f"{field}[0]: rows of input {sequence.input!r} hold {array.shape[1]} values, past its maximum length "
            f"{sequence.max_length}",
            field=f"{field}[0]",
            value=int(array.shape[1]),
            allowed=f"at most {sequence.max_length} values",
        )
    if sequence.ids is None or array.size == 0:
        return
    low, high = sequence.ids
    smallest, largest = int(array.min()), int(array.max())
    if low <= smallest and largest < high:
        return
    row, position = (int(i) for i in np.argwhere((array < low) | (array >= high))[0])
    value = int(array[row, position])
    raise InvalidInput(
        f"{field}[{row}][{position}]: id {value} in row {row} of input {sequence.input!r} is outside its id range "
        f"{low}..{high - 1}",
        field=f"{field}[{row}][{position}]",
        value=value,
        allowed=f"ids {low}..{high - 1}",
    )


def _string_array(field: str, value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A string input from an array of `str` (any width) or of objects that are all `str`, as the object array
    onnxruntime takes."""
    _check_shape(field, value, spec)
    if value.dtype.kind == "U":
        return value.astype(object)
    flat = value.reshape(-1)
    kinds = set(map(type, flat.tolist()))
    if not kinds <= {str}:
        index = next(i for i, item in enumerate(flat.tolist()) if type(item) is not str)
        where = field + "".join(f"[{i}]" for i in np.unravel_index(index, value.shape))
        raise InvalidInput(
            f"{where}: {short_repr(flat[index])} ({type(flat[index]).__name__}) is not allowed; "
            f"input {spec.name!r} takes strings",
            field=where,
            value=flat[index],
            allowed="string strings",
        )
    return value


# A CSV cell is a plain ASCII decimal: float() alone would also take `1_0`, `١٢` and ` ∞`-like spellings. Linear
# time: each run of digits matches one way only (servestack/inference/columns.py's `_DECIMAL` says why).
_CSV_NUMBER = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|nan|inf|infinity)", re.IGNORECASE | re.ASCII
)


def is_csv_number(cell: str) -> bool:
    """Whether a CSV cell is a number the CSV codec reads."""
    return _CSV_NUMBER.fullmatch(cell.strip(" \t")) is not None


def _csv_to_array(rows: list[list[str]], spec: TensorSpec, manifest: Manifest, max_rows: int) -> np.ndarray:
    if spec.dtype == "string" or spec.numpy_dtype.kind != "f":
        raise InvalidInput(
            f"CSV carries numbers; input {spec.name!r} takes {spec.dtype}",
            field="Content-Type",
            value=CSV,
            allowed="application/json or application/x-npy",
        )
    _check_rows("csv", len(rows), max_rows)
    width = spec.row_shape[0] if len(spec.row_shape) == 1 else None
    if width is None and rows:
        width = len(rows[0])
    values: list[list[float]] = []
    for line_number, cells in enumerate(rows, start=1):
        if len(cells) != width:
            raise InvalidInput(
                f"csv line {line_number}: {len(cells)} columns, the model takes {width}",
                field=f"csv line {line_number}",
                value=f"{len(cells)} columns",
                allowed=f"{width} columns",
            )
        row: list[float] = []
        for column_number, cell in enumerate(cells, start=1):
            text = cell.strip(" \t")
            if _CSV_NUMBER.fullmatch(text) is None:
                raise InvalidInput(
                    f"csv line {line_number}, column {column_number}: {text[:40]!r} is not a number",
                    field=f"csv line {line_number} column {column_number}",
                    value=text,
                    allowed=f"{spec.dtype} numbers (ASCII decimal, e.g. -1.5e3)",
                )
            row.append(float(text))
        values.append(row)
    array = np.asarray(values, dtype=np.float64).reshape(len(values), -1) if values else np.empty((0,))
    if array.size:
        _check_shape("csv", array, spec)
        array = _cast("csv", array, spec.numpy_dtype, manifest)
    return array


def _check_shape(field: str, array: np.ndarray, spec: TensorSpec) -> None:
    if array.shape[1:] == spec.shape[1:] and array.shape[0] > 0:  # the common case: every row dimension fixed
        return
    if array.ndim == len(spec.shape) - 1 and array.ndim >= 1 and array.size > 0:
        raise InvalidInput(
            f"{field}: got a single row of shape {list(array.shape)}; send a list of rows, e.g. [[...]]",
            field=field,
            value=f"shape {list(array.shape)}",
            allowed=f"rows of shape {_shape_text(spec.row_shape)}",
        )
    if array.shape[:1] == (0,):
        return
    if array.ndim != len(spec.shape) or any(
        expected is not None and expected != actual for expected, actual in zip(spec.shape, array.shape, strict=False)
    ):
        where = field
        if array.ndim == len(spec.shape):
            for axis, (expected, actual) in enumerate(zip(spec.row_shape, array.shape[1:], strict=True), start=1):
                if expected is not None and expected != actual:
                    where = f"{field}[0]" if axis == 1 else field
                    raise InvalidInput(
                        f"{where}: each row needs {expected} values on axis {axis}, got {actual}",
                        field=where,
                        value=actual,
                        allowed=f"{expected} (rows of shape {_shape_text(spec.row_shape)})",
                    )
        raise InvalidInput(
            f"{field}: shape {list(array.shape)} does not fit the model input {spec.name!r}",
            field=field,
            value=f"shape {list(array.shape)}",
            allowed=f"[batch, {', '.join(_dim_text(d) for d in spec.row_shape)}]",
        )


_FLOAT_MAX: dict[str, float] = {}


_SQUARE_SUMMED = frozenset("fd")  # float32 and float64 arrays: `np.vdot` sums their squares in their own dtype


def finite_in(array: np.ndarray, target: np.dtype[Any]) -> bool:
    """Every value finite and within `target`'s range (NaN fails the comparison), so the cast that follows
    can neither overflow to infinity nor warn. False may also mean "not sure": callers then take the path
    that checks value by value, so this only has to be right when it says True."""
    limit = _FLOAT_MAX.get(target.char)
    if limit is None:
        limit = _FLOAT_MAX[target.char] = float(np.finfo(target).max) if target.kind == "f" else np.inf
    if array.size == 0:
        return True
    square_limit = limit * limit
    if square_limit != np.inf and array.dtype.char in _SQUARE_SUMMED:
        # One call instead of two reductions (each costs more than a small request's whole arithmetic): a sum
        # of squares is at least its largest square, and NaN or an overflow makes it fail, so a sum within
        # limit**2 proves every value within +-limit (float64 rounding is ~1e-16 relative, far inside the
        # half-ulp margin of a float32 cast). A sum past it proves nothing: the caller checks value by value.
        return float(np.vdot(array, array)) <= square_limit
    # Two reductions and no temporary: np.abs(array) would allocate a copy of the batch first. The extremes are
    # compared as Python floats: compared as numpy scalars of a narrower dtype (float16, or float32 against
    # float64's limit), the limit would be cast to that dtype, which overflows (a warning, an error here).
    smallest = float(np.minimum.reduce(array, axis=None))
    largest = float(np.maximum.reduce(array, axis=None))
    return -limit <= smallest and largest <= limit


def _cast(field: str, array: np.ndarray, target: np.dtype[Any], manifest: Manifest) -> np.ndarray:
    """Cast to the model's dtype; floats must be finite and fit it, unless the manifest allows non-finite."""
    if array.dtype.kind == "f" and target.kind == "f":
        if manifest.allow_non_finite:
            with np.errstate(over="ignore"):  # the model asked for infinities; overflow is one way to get them
                return array.astype(target, copy=False)
        if not finite_in(array, target):
            _check_finite(field, array)
            _check_range(field, array, target)
    return array.astype(target, copy=False)


def _check_range(field: str, array: np.ndarray, target: np.dtype[Any]) -> None:
    """Raise for the first value outside `target`'s range; return if there is none (`finite_in` may say
    False when only unsure)."""
    limit = float(np.finfo(target).max)
    beyond = np.argwhere(np.abs(array) > limit)
    if not len(beyond):
        return
    index = tuple(int(i) for i in beyond[0])
    path = field + "".join(f"[{i}]" for i in index)
    raise InvalidInput(
        f"{path}: {float(array[index])!r} does not fit {target.name}",
        field=path,
        value=float(array[index]),
        allowed=f"finite numbers within +-{limit:.4g}",
    )


def _check_finite(field: str, array: np.ndarray) -> None:
    finite = np.isfinite(array)
    if not finite.all():
        index = tuple(int(i) for i in np.argwhere(~finite)[0])
        path = field + "".join(f"[{i}]" for i in index)
        raise InvalidInput(
            f"{path}: {float(array[index])!r} is not allowed; this model takes finite numbers only",
            field=path,
            value=str(array[index]),
            allowed="finite numbers (no NaN or Infinity)",
        )


def _explain(field: str, value: Any, spec: TensorSpec) -> InvalidInput:
    """Find the first element that stops `value` from being an array of `spec`, and say what it is."""
    problem = _find_problem(field, value, spec)
    if problem is not None:
        return problem
    lengths = sorted({len(row) for row in value if isinstance(row, list)})
    return InvalidInput(
        f"{field}: rows of different lengths {lengths[:8]}",
        field=field,
        value=lengths[:8],
        allowed=f"rows of shape {_shape_text(spec.row_shape)}",
    )


def _find_problem(field: str, value: Any, spec: TensorSpec) -> InvalidInput | None:
    """The first element, in row order, that is not what `spec` takes; None when every element is."""
    wanted = "strings" if spec.dtype == "string" else ("integers" if spec.numpy_dtype.kind in "iu" else "numbers")
    row_shape = spec.row_shape

    def walk(node: Any, path: str, depth: int) -> InvalidInput | None:
        if depth < len(spec.shape):
            if not isinstance(node, _SEQUENCES):
                return InvalidInput(
                    f"{path}: expected a list, got {type(node).__name__} {short_repr(node)}",
                    field=path,
                    value=node,
                    allowed=f"rows of shape {_shape_text(row_shape)}",
                )
            expected = spec.shape[depth] if depth > 0 else None
            if expected is not None and len(node) != expected:
                return InvalidInput(
                    f"{path}: {len(node)} values, the model takes {expected}",
                    field=path,
                    value=len(node),
                    allowed=f"{expected} values",
                )
            for index, child in enumerate(node):
                problem = walk(child, f"{path}[{index}]", depth + 1)
                if problem is not None:
                    return problem
            return None
        if spec.dtype == "string":
            ok = isinstance(node, str)
        elif spec.numpy_dtype.kind == "b":
            ok = isinstance(node, bool | np.bool_)
        else:
            ok = isinstance(node, int | float | np.number) and not isinstance(node, bool)
            if isinstance(node, int) and not -(2**63) <= node < 2**64:
                ok = False  # beyond any integer dtype
        if spec.numpy_dtype.kind in "iu" and isinstance(node, float):
            ok = False
        if not ok:
            return InvalidInput(
                f"{path}: {short_repr(node)} ({type(node).__name__}) is not allowed; "
                f"input {spec.name!r} takes {wanted}",
                field=path,
                value=node,
                allowed=f"{spec.dtype} {wanted}",
            )
        return None

    return walk(value, field, 0)


def _dim_text(size: int | None) -> str:
    return "any" if size is None else str(size)


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join(_dim_text(size) for size in shape) + "]"
