"""A `dataframe_split` body read straight into a tabular model's columns, for the common request: the model's
columns in its own order, every value of its column's type.

The general path (servestack/inference/columns.py) parses the body into Python objects with orjson, checks the
split's keys, names and rows in Python, transposes the rows, then checks each cell's type once more before
converting (servestack/inference/column_plan.py). Here msgspec parses the body against a schema made once per
model (a row is a tuple of the columns' types: int or float for a float column, int, bool, str), so the type
of every cell, the width of every row and the absence of any other key are proven while parsing, in C; what
is left is one transpose and the conversion itself (`RowsPlan.arrays`: `column_plan.typed_arrays`' steps, by
column position, with no mapping of column names built per request). msgspec yields the same Python values
orjson does for what it accepts (ints stay ints, floats are read to the nearest double). Anything else
(another column order, a null, a boolean in a number column, an unknown key, malformed JSON, a value out of
range) makes the reader decline (None), and the general path decides and names the problem: every refusal
comes from there (tests/unit/test_split_reader.py holds the two paths to the same arrays).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from servestack.inference.column_plan import SQUARED_MAX, ConversionPlan, conversion_plan
from servestack.inference.manifest import ColumnSpec, Manifest, numpy_dtype_of

Arrays = dict[str, Any]

# The key a body must name near its start for the reader to try it: other JSON bodies cost one bounded search.
_KEY = b'"dataframe_split"'
_KEY_WITHIN = 64
# A cell's Python type by its column's numpy kind (a string column's dtype is object).
_CELL_TYPES: dict[str, Any] = {"f": int | float, "i": int, "u": int, "b": bool, "O": str}
_chain = itertools.chain.from_iterable
# `struct` packers of n native doubles, by n (bounded: n is at most the row limit times a model's float columns).
_PACKERS: dict[int, struct.Struct] = {}
_PACKERS_LIMIT = 4096


def _packer(count: int) -> struct.Struct:
    packer = _PACKERS.get(count)
    if packer is None:
        packer = struct.Struct(f"{count}d")
        if len(_PACKERS) < _PACKERS_LIMIT:
            _PACKERS[count] = packer
    return packer


Signature = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]


class PlannedArrays(dict[str, np.ndarray]):
    """A request's input arrays as the reader gives them (each input one column), with what the micro-batcher
    would otherwise work out again for every request: the plan that made them, so their batching signature
    (`grouping.signature`'s value, known per model), and each float group's columns as the one `[k, rows, 1]`
    array the dict's columns are views of, so a batch joins each group in one `np.concatenate`
    (`grouping.stack`) rather than one per column. Read-only, as every request's arrays are on their way to the
    model: an entry replaced would leave `blocks` and the signature saying otherwise."""

    __slots__ = ("blocks", "plan")

    plan: RowsPlan
    blocks: list[np.ndarray]  # per float group of `plan.floats`, its columns' `[k, rows, 1]` array


@dataclass(frozen=True, slots=True)
class RowsPlan:
    """`ConversionPlan` by column position (the model's column order, a row's order), worked out once per model."""

    names: tuple[str, ...]
    # (float16/32/64, its columns, SQUARED_MAX, where its columns lie in a row when they are next to each other)
    floats: tuple[tuple[np.dtype[Any], tuple[int, ...], float, slice | None], ...]
    integers: tuple[tuple[int, np.dtype[Any], int, int], ...]  # (column, dtype, its smallest and largest value)
    booleans: tuple[int, ...]
    strings: tuple[int, ...]
    # Each input, when every input is fed by one column: the inputs are the columns, named in order.
    single: bool
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    # The arrays' batching signature when every input is one column (`PlannedArrays`); None otherwise.
    signature: Signature | None
    # For `grouping.stack`: the names of each float group's columns, in its block's order; the other columns.
    block_names: tuple[tuple[str, ...], ...]
    other_names: tuple[str, ...]

    def arrays(self, columns: list[tuple[Any, ...]], rows: int) -> Arrays | None:
        """`column_plan.typed_arrays` of the columns (each a tuple of `rows` values of its column's Python type),
        as the same arrays, value for value; None for a value out of range."""
        values: list[Any] = [None] * len(columns)
        blocks = []
        for target, positions, squared_max, span in self.floats:
            count = len(positions)
            # One row per column, each value read as `np.array` reads it (a float as it is, an int by `float()`),
            # packed by `struct` straight into the array's memory: a quarter fewer instructions than `np.fromiter`.
            table = np.empty(count * rows, np.float64)
            cells = _chain([columns[at] for at in positions])
            try:
                _packer(count * rows).pack_into(table, 0, *cells)  # type: ignore[arg-type]  # numpy's buffer
            except struct.error:  # an integer past float64 (`struct` says so in its own words)
                return None
            if not float(np.vdot(table, table)) <= squared_max:  # NaN and infinity fail too
                return None
            # Each column a [rows, 1] view of one cast, so an input of one column needs no reshape of its own.
            cast = table.astype(target, copy=False).reshape(count, rows, 1)
            blocks.append(cast)
            if span is not None:  # the views taken into the list by one slice assignment, in C
                values[span] = cast
            else:
                for at, column in zip(positions, cast, strict=True):
                    values[at] = column
        for at, dtype, smallest, largest in self.integers:
            try:
                array = np.array(columns[at], dtype=np.int64)
            except OverflowError:  # past int64
                return None
            if dtype != np.int64 and not (smallest <= int(array.min()) and int(array.max()) <= largest):
                return None
            values[at] = array.astype(dtype, copy=False).reshape(rows, 1)
        for at in self.booleans:
            values[at] = np.array(columns[at], dtype=bool).reshape(rows, 1)
        for at in self.strings:
            values[at] = np.fromiter(columns[at], object, rows).reshape(rows, 1)
        if self.signature is not None:
            planned = PlannedArrays(zip(self.names, values, strict=True))
            planned.plan = self
            planned.blocks = blocks
            return planned
        if self.single:
            return dict(zip(self.names, values, strict=True))
        return {
            name: values[fed[0]] if len(fed) == 1 else np.concatenate([values[at] for at in fed], axis=1)
            for name, fed in self.inputs
        }


def _span(positions: tuple[int, ...]) -> slice | None:
    """`positions` as a slice when they are consecutive and ascending."""
    if positions == tuple(range(positions[0], positions[0] + len(positions))):
        return slice(positions[0], positions[0] + len(positions))
    return None


def rows_plan(plan: ConversionPlan, names: list[str], dtypes: list[np.dtype[Any]]) -> RowsPlan:
    """`plan` by the position of each column in `names` (the model's column order; `dtypes`, their dtypes)."""
    at = {name: position for position, name in enumerate(names)}
    inputs = tuple((name, tuple(at[column] for column in fed)) for name, fed in plan.inputs)
    single = [fed[0] for _, fed in inputs if len(fed) == 1] == list(range(len(names))) and all(
        name == names[fed[0]] for name, fed in inputs
    )
    floats = []
    for dtype, columns in plan.floats:
        positions = tuple(at[c] for c in columns)
        floats.append((dtype, positions, SQUARED_MAX[dtype.char], _span(positions)))
    # `grouping.signature` of the arrays: each input a [rows, 1] column of its column's dtype, sorted by name.
    signature = tuple(sorted((name, dtype, (1,)) for name, dtype in zip(names, dtypes, strict=True)))
    block_names = tuple(tuple(names[at] for at in positions) for _, positions, _, _ in floats)
    in_blocks = {name for group in block_names for name in group}
    return RowsPlan(
        tuple(names),
        tuple(floats),
        tuple((at[column], dtype, smallest, largest) for column, dtype, smallest, largest in plan.integers),
        tuple(at[column] for column in plan.booleans),
        tuple(at[column] for column in plan.strings),
        single,
        inputs,
        signature if single else None,
        block_names,
        tuple(name for name in names if name not in in_blocks),
    )


class SplitReader:
    """The reader of one model's `dataframe_split` bodies (`split_reader` builds it once per model)."""

    __slots__ = ("_decoder", "_names", "_plan")

    def __init__(
        self, names: list[str], decoder: msgspec.json.Decoder[Any], plan: ConversionPlan, dtypes: list[np.dtype[Any]]
    ) -> None:
        self._names = names
        self._decoder = decoder
        self._plan = rows_plan(plan, names, dtypes)

    def arrays(self, body: bytes, max_rows: int) -> Arrays | None:
        """The model's input arrays from a `dataframe_split` body of the common kind; None for any other body."""
        if body.find(_KEY, 0, _KEY_WITHIN) < 0:
            return None
        try:
            split = self._decoder.decode(body).dataframe_split
        except msgspec.MsgspecError:  # malformed, or not of the common kind: the general path names why
            return None
        data = split.data
        index = split.index
        if split.columns != self._names or not 0 < len(data) <= max_rows:
            return None
        if index is not None and len(index) != len(data):
            return None
        return self._plan.arrays(list(zip(*data, strict=False)), len(data))


def split_reader(manifest: Manifest, specs: tuple[ColumnSpec, ...]) -> SplitReader | None:
    """The reader for a model whose columns are `specs` (`columns.columns_of`); None without columns."""
    if not specs:
        return None
    row = tuple.__class_getitem__(tuple(_CELL_TYPES[numpy_dtype_of(column.dtype).kind] for column in specs))
    split = msgspec.defstruct(
        "Split",
        [("columns", list[str]), ("data", list[row]), ("index", list[Any] | None, None)],  # type: ignore[valid-type]
        forbid_unknown_fields=True,
        gc=False,  # holds no cycles: not tracked, so a request's parse adds nothing for the collector to walk
    )
    request = msgspec.defstruct("SplitRequest", [("dataframe_split", split)], forbid_unknown_fields=True, gc=False)
    names = [column.name for column in specs]
    dtypes = [numpy_dtype_of(column.dtype) for column in specs]
    return SplitReader(names, msgspec.json.Decoder(request), conversion_plan(manifest, specs), dtypes)
