"""Parquet record batches holding a model's inputs by tensor: a column per model input (a list column for an
input with a row dimension), or, for a one-input model with rows of `k` values, exactly `k` numeric columns in
file order. (A model with named columns reads Parquet by column name: servestack/inference/tabular/named.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.manifest import TensorSpec
from servestack.inference.service import ServedModel
from servestack.inference.tabular.arrow_arrays import numbers
from servestack.inference.tabular.rows import PARQUET, Records

# (indices of the rows that decoded, their arrays, (row index, why) of the others)
Tensors = tuple[np.ndarray, dict[str, np.ndarray] | None, list[tuple[int, ServingError]]]


def tensor_records(model: ServedModel, records: Records) -> Tensors:
    """A Parquet record batch to inputs, column by column. Either every model input has a column of its name
    (a list column for an input with a row dimension), or a one-input model with rows of `k` values reads a
    file of exactly `k` numeric columns, in file order. Rows with a null, a list of the wrong length or a value
    the input cannot take are errors; the others decode."""
    rows = len(records)
    manifest = model.manifest
    batch = records.batch
    names = list(batch.schema.names)

    def every_row(error: ServingError) -> Tensors:
        return (np.empty(0, dtype=np.int64), None, [(index, error) for index in range(rows)])

    if model.hooks.preprocess is not None:
        return every_row(
            InvalidInput(
                f"model {manifest.key} has a preprocess hook, which reads JSON or CSV payloads, not Parquet columns",
                field="format",
                value=PARQUET,
                allowed="JSON Lines or CSV input for this model",
            )
        )
    bad_rows = np.zeros(rows, dtype=bool)
    reasons: dict[int, ServingError] = {}
    arrays: dict[str, np.ndarray] = {}
    sources: dict[str, tuple[TensorSpec, list[Any], str, bool]]
    if all(spec.name in names for spec in manifest.inputs):
        sources = {spec.name: (spec, [batch.column(spec.name)], spec.name, False) for spec in manifest.inputs}
    elif (
        len(manifest.inputs) == 1
        and len(manifest.inputs[0].row_shape) == 1
        and manifest.inputs[0].row_shape[0] == len(names)
    ):
        spec = manifest.inputs[0]
        sources = {spec.name: (spec, [batch.column(name) for name in names], "columns", True)}
    else:
        widths = [list(spec.row_shape) for spec in manifest.inputs]
        return every_row(
            InvalidInput(
                f"{records.source}: columns {names[:8]} do not fit the inputs of {manifest.key}",
                field="columns",
                value=names[:8],
                allowed=(
                    f"a column per input {[spec.name for spec in manifest.inputs]}, or for one input of rows of "
                    f"k values, exactly k numeric columns (rows: {widths})"
                ),
            )
        )
    for name, (spec, columns, where, stacked) in sources.items():
        values, problems = _columns_to_array(columns, spec, where, rows, stacked, manifest.allow_non_finite)
        for index, error in problems.items():
            if not bad_rows[index]:
                bad_rows[index] = True
                reasons[index] = error
        if values is not None:
            arrays[name] = values
    good = np.flatnonzero(~bad_rows)
    if len(arrays) != len(manifest.inputs) or not len(good):
        return np.empty(0, dtype=np.int64), None, [(index, reasons[index]) for index in range(rows)]
    bad = [(int(index), reasons[int(index)]) for index in np.flatnonzero(bad_rows)]
    chosen = {
        name: (values if len(good) == rows else values[good]).astype(
            spec_of(manifest.inputs, name).numpy_dtype, copy=False
        )
        for name, values in arrays.items()
    }
    return good, chosen, bad


def spec_of(inputs: tuple[TensorSpec, ...], name: str) -> TensorSpec:
    return next(spec for spec in inputs if spec.name == name)


_KINDS = {"f": "fiu", "i": "iu", "u": "u", "b": "b"}


def _columns_to_array(
    columns: list[Any], spec: TensorSpec, where: str, rows: int, stacked: bool, allow_non_finite: bool
) -> tuple[np.ndarray | None, dict[int, ServingError]]:
    """(values for every row, zeros in bad rows; the errors of the bad rows). `stacked`: one scalar column per
    value of the row, else one column for the input (a list column when rows have a dimension)."""
    import pyarrow as pa

    problems: dict[int, ServingError] = {}
    target = spec.numpy_dtype
    if spec.dtype == "string" or target.kind not in _KINDS:
        error = InvalidInput(
            f"input {spec.name!r} takes {spec.dtype}; Parquet input reads numeric and boolean inputs",
            field=where,
            allowed="a numeric or boolean input",
        )
        return None, dict.fromkeys(range(rows), error)
    row_shape = spec.row_shape
    nested = not (stacked or not row_shape)
    value_types = [getattr(column.type, "value_type", column.type) if nested else column.type for column in columns]
    # Floats no wider than a float input are read straight into its dtype: the same values as through float64
    # (widening is exact, and float64 -> float32 rounds once either way), and none can overflow it. Anything
    # else goes through float64 first, so that a value too large for the input is named as such.
    narrow = target.kind == "f" and all(  # each type once: a file's columns are mostly of one or two types
        pa.types.is_floating(kind) and kind.bit_width <= 8 * target.itemsize for kind in set(value_types)
    )
    work = target if narrow or target.kind != "f" else np.dtype(np.float64)
    row_sums: np.ndarray | None = None
    if not nested:  # scalar columns: one per value of the row (or the input is a scalar)
        width = len(columns)
        # Uninitialised (no page zeroed for nothing): every column below fills its own, nulls as zeros.
        values = np.empty((rows, width) if row_shape else (rows,), dtype=work)
        # Each row's sum for `_finite_rows`, added up column by column as they are read: a pass over each
        # column's contiguous values, where summing the rows of `values` afterwards cost ~5x the CPU.
        row_sums = np.zeros(rows, dtype=work) if row_shape and target.kind == "f" else None
        read: list[np.ndarray] = []
        readable: dict[Any, bool] = {}  # by Arrow type: the checks once per type, not once per column
        for position, column in enumerate(columns):
            kind = column.type
            fits = readable.get(kind)
            if fits is None:
                fits = readable[kind] = not pa.types.is_nested(kind) and _numeric_type(kind, target.kind)
            if not fits:
                error = _type_error(spec, where, column.type, position)
                return None, dict.fromkeys(range(rows), error)
            filled = column
            if column.null_count:
                import pyarrow.compute as pc  # only here: its import costs a job without nulls ~0.05 CPU s

                nulls = column.is_null().to_numpy(zero_copy_only=False)
                for index in np.flatnonzero(nulls):
                    problems.setdefault(int(index), _null_error(spec, where, position))
                filled = pc.fill_null(column, 0)
            data = numbers(filled)
            if row_shape:
                read.append(data)
            else:
                values[:] = data
        if row_sums is not None:
            with np.errstate(over="ignore", invalid="ignore"):  # a sum that is not finite is a suspect
                for data in read:
                    row_sums += data  # cast as `values` casts it: the same kind, or ints to floats
        _fill_columns(values, read)
    else:
        import pyarrow.compute as pc

        (column,) = columns
        if not (
            pa.types.is_list(column.type)
            or pa.types.is_large_list(column.type)
            or pa.types.is_fixed_size_list(column.type)
        ):
            return None, dict.fromkeys(range(rows), _type_error(spec, where, column.type, None))
        inner = column.type.value_type
        if len(row_shape) != 1 or row_shape[0] is None or not _numeric_type(inner, target.kind):
            return None, dict.fromkeys(range(rows), _type_error(spec, where, column.type, None))
        width = int(row_shape[0])
        lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(column)
        parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
        inner_nulls = flat.is_null().to_numpy(zero_copy_only=False)
        for index in np.unique(parents[inner_nulls]):
            problems.setdefault(int(index), _null_error(spec, where, None))
        for index in np.flatnonzero(lengths != width):
            problems.setdefault(
                int(index),
                InvalidInput(
                    f"{where}: a row of {int(lengths[index]) if lengths[index] >= 0 else 'null'} values, the model "
                    f"takes {width}",
                    field=where,
                    value=int(lengths[index]) if lengths[index] >= 0 else None,
                    allowed=f"{width} values",
                ),
            )
        values = np.zeros((rows, width), dtype=work)
        fits = lengths == width
        data = (pc.fill_null(flat, 0) if flat.null_count else flat).to_numpy(zero_copy_only=False)
        keep = fits[parents]
        values[fits] = data[keep].reshape(-1, width)
    if target.kind == "f":
        flat_values = values.reshape(rows, -1)
        finite = _finite_rows(flat_values, row_sums)
        limit = float(np.finfo(target).max)
        if not allow_non_finite:
            for index in np.flatnonzero(~finite):
                problems.setdefault(
                    int(index),
                    InvalidInput(
                        f"{where}: NaN or infinity; this model takes finite numbers only",
                        field=where,
                        allowed="finite numbers (no NaN or Infinity)",
                    ),
                )
        if narrow or allow_non_finite:
            return values, problems
        with np.errstate(invalid="ignore"):
            too_large = finite & (np.abs(flat_values) > limit).any(axis=1)
        for index in np.flatnonzero(too_large):
            problems.setdefault(
                int(index),
                InvalidInput(
                    f"{where}: a value does not fit {target.name}",
                    field=where,
                    allowed=f"finite numbers within +-{limit:.4g}",
                ),
            )
    return values, problems


# Rows written together into a 2-D input (`_fill_columns`): 4,096 rows of 30 float32 values are 480 KB, within a
# core's L2 cache, so each block's cache lines are filled by every column before they are left.
_FILL_BLOCK_ROWS = 4096


def _fill_columns(values: np.ndarray, columns: list[np.ndarray]) -> None:
    """`values[:, i] = columns[i]` for each column, a block of rows at a time. Column by column down the whole
    array, each column's pass touched every row's cache line again, out of the cache by then: a 50,000-row chunk
    of 30 float32 columns took 1.74 ms to fill that way, 1.38 ms by blocks (the minimum of 40 runs)."""
    for start in range(0, len(values), _FILL_BLOCK_ROWS):
        block = values[start : start + _FILL_BLOCK_ROWS]
        for position, column in enumerate(columns):
            block[:, position] = column[start : start + _FILL_BLOCK_ROWS]


def _finite_rows(values: np.ndarray, row_sums: np.ndarray | None = None) -> np.ndarray:
    """Whether each row of a 2-D float array holds finite numbers only. A row's sum is NaN or infinite whenever
    one of its values is, so only the rows whose sum is not finite (those, and rows of finite values whose sum
    overflows) are checked value by value: one pass that writes a number per row, not a boolean per value.
    `row_sums`: the rows' sums in any order of addition, when the caller has them."""
    with np.errstate(over="ignore", invalid="ignore"):
        suspect = np.flatnonzero(~np.isfinite(values.sum(axis=1) if row_sums is None else row_sums))
    finite = np.ones(len(values), dtype=bool)
    if len(suspect):
        finite[suspect] = np.isfinite(values[suspect]).all(axis=1)
    return finite


def _numeric_type(arrow_type: Any, kind: str) -> bool:
    import pyarrow as pa

    if pa.types.is_boolean(arrow_type):
        return kind == "b"
    if pa.types.is_floating(arrow_type):
        return "f" in _KINDS[kind]
    if pa.types.is_unsigned_integer(arrow_type):
        return "u" in _KINDS[kind]
    if pa.types.is_integer(arrow_type):
        return "i" in _KINDS[kind]
    return False


def _type_error(spec: TensorSpec, where: str, arrow_type: Any, position: int | None) -> InvalidInput:
    column = f"column {position + 1}" if position is not None else where
    if hasattr(arrow_type, "index_type"):  # strings are read as dictionaries (parquet_reading.py): name the values
        arrow_type = arrow_type.value_type
    return InvalidInput(
        f"{column}: Parquet type {arrow_type} does not fit input {spec.name!r} ({spec.dtype}, rows of "
        f"{list(spec.row_shape)})",
        field=where,
        value=str(arrow_type),
        allowed=f"{spec.dtype}-compatible numbers" + (" in a list column" if spec.row_shape else ""),
    )


def _null_error(spec: TensorSpec, where: str, position: int | None) -> InvalidInput:
    column = f"column {position + 1}" if position is not None else where
    return InvalidInput(
        f"{column}: null; input {spec.name!r} takes a value in every row",
        field=where,
        value=None,
        allowed=f"{spec.dtype} values, no nulls",
    )
