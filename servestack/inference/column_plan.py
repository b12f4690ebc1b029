"""The shortcut of `servestack.inference.columns.arrays_from_columns` for JSON columns whose values are all plainly
valid.

A tabular request (`dataframe_split`, records, columnar `inputs`) is mostly numbers and strings that need no
more than a type check. Checking and casting each column alone costs a few Python calls per column; here the
float columns of one dtype convert together (one type check over all their cells, one numpy call, one range
check), string columns are taken as they are, integer and boolean columns take one check each. Anything not
plainly valid (a null, NaN, a boolean in a number column, a value out of range, an array from a hook) makes
the shortcut decline, and the column-by-column path decides and names the problem: every refusal comes from
there. What the shortcut accepts, it converts to the same arrays, value for value: the same float64 parse
and cast (tests/unit/test_column_conversion.py holds the two paths equal).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from servestack.inference.manifest import ColumnSpec, Manifest, numpy_dtype_of

Arrays = dict[str, np.ndarray]

# The bound on a column's sum of squares for a target dtype: its largest value squared (float64's square is
# past float64: there the largest value itself, which still proves every value finite).
SQUARED_MAX = {"e": float(np.finfo(np.float16).max) ** 2, "f": float(np.finfo(np.float32).max) ** 2}
SQUARED_MAX["d"] = float(np.finfo(np.float64).max)

_NUMBERS = frozenset({int, float})
_INTEGERS = frozenset({int})
_BOOLEANS = frozenset({bool})
_TEXT = frozenset({str})
_LISTS = frozenset({list, tuple})


@dataclass(frozen=True, slots=True)
class ConversionPlan:
    """A model's columns grouped by how they convert, worked out once per manifest."""

    names: frozenset[str]
    floats: tuple[tuple[np.dtype[Any], tuple[str, ...]], ...]  # (float16/32/64, its columns)
    integers: tuple[tuple[str, np.dtype[Any], int, int], ...]  # (column, dtype, its smallest and largest value)
    booleans: tuple[str, ...]
    strings: tuple[str, ...]
    # Each input: its one `[N, 1]` column, or its `[N, k]` columns in index order.
    inputs: tuple[tuple[str, tuple[str, ...]], ...]


@functools.lru_cache(maxsize=256)
def conversion_plan(manifest: Manifest, specs: tuple[ColumnSpec, ...]) -> ConversionPlan:
    """The plan for `specs`, the manifest's columns (`servestack.inference.columns.columns_of`)."""
    floats: dict[np.dtype[Any], list[str]] = {}
    integers: list[tuple[str, np.dtype[Any], int, int]] = []
    feeding: dict[str, list[ColumnSpec]] = {}
    for column in specs:
        feeding.setdefault(column.input, []).append(column)
        dtype = numpy_dtype_of(column.dtype)
        if dtype.kind == "f":
            floats.setdefault(dtype, []).append(column.name)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            integers.append((column.name, dtype, int(info.min), int(info.max)))
    return ConversionPlan(
        frozenset(column.name for column in specs),
        tuple((dtype, tuple(names)) for dtype, names in floats.items()),
        tuple(integers),
        tuple(column.name for column in specs if column.dtype == "bool"),
        tuple(column.name for column in specs if column.dtype == "string"),
        tuple(
            (spec.name, tuple(column.name for column in sorted(feeding[spec.name], key=lambda c: c.index or 0)))
            for spec in manifest.inputs
            if spec.name in feeding  # every input, for a model with columns; none for a model without
        ),
    )


def planned_arrays(plan: ConversionPlan, columns: Mapping[str, Any], max_rows: int | None) -> Arrays | None:
    """The model's input arrays when `columns` names exactly the plan's columns, each a list (or tuple) of one
    length within 1..`max_rows`, holding only numbers in number columns (integers in integer columns, within
    range; for floats, a sum of squares within the dtype's largest value squared, which proves every value
    finite and in range), only true/false in boolean columns and only text in string columns. None for
    anything else."""
    if columns.keys() != plan.names or not set(map(type, columns.values())) <= _LISTS:
        return None
    lengths = set(map(len, columns.values()))
    if len(lengths) != 1 or not 0 < lengths.pop() <= (max_rows if max_rows is not None else math.inf):
        return None
    for _, names in plan.floats:
        if not set(map(type, itertools.chain.from_iterable([columns[name] for name in names]))) <= _NUMBERS:
            return None
    for name, _, _, _ in plan.integers:
        if not set(map(type, columns[name])) <= _INTEGERS:
            return None
    for name in plan.booleans:
        if not set(map(type, columns[name])) <= _BOOLEANS:
            return None
    for name in plan.strings:
        if not set(map(type, columns[name])) <= _TEXT:
            return None
    return typed_arrays(plan, columns, len(next(iter(columns.values()))))


def typed_arrays(plan: ConversionPlan, columns: Mapping[str, Any], rows: int) -> Arrays | None:
    """`planned_arrays` of columns already known to name the plan's columns, each of `rows` values (within the
    row limit), holding only values of their columns' Python types (int or float in a float column, int in an
    integer column, bool, str): the conversion and the range checks alone. None for a value out of range."""
    values: dict[str, np.ndarray] = {}
    for target, names in plan.floats:
        count = len(names)
        try:
            # One row per column, each value read as `np.array` reads it, without first discovering a shape.
            table = np.fromiter(
                itertools.chain.from_iterable([columns[name] for name in names]), np.float64, count * rows
            )
        except OverflowError:  # an integer past float64
            return None
        if not float(np.vdot(table, table)) <= SQUARED_MAX[target.char]:  # NaN and infinity fail too
            return None
        # Each column a [rows, 1] view of one cast, so an input of one column needs no reshape of its own.
        values.update(zip(names, table.astype(target, copy=False).reshape(count, rows, 1), strict=True))
    for name, dtype, smallest, largest in plan.integers:
        try:
            array = np.array(columns[name], dtype=np.int64)
        except OverflowError:  # past int64
            return None
        if dtype != np.int64 and not (smallest <= int(array.min()) and int(array.max()) <= largest):
            return None
        values[name] = array.astype(dtype, copy=False).reshape(rows, 1)
    for name in plan.booleans:
        values[name] = np.array(columns[name], dtype=bool).reshape(rows, 1)
    for name in plan.strings:
        values[name] = np.array(columns[name], dtype=object).reshape(rows, 1)
    return {
        name: values[fed[0]] if len(fed) == 1 else np.concatenate([values[c] for c in fed], axis=1)
        for name, fed in plan.inputs
    }
