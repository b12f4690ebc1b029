"""A `dataframe_split` body read straight into a tabular model's columns, for the common request: the model's
columns in its own order, every value of its column's type.

The general path (servestack/inference/columns.py) parses the body into Python objects with orjson, checks the
split's keys, names and rows in Python, transposes the rows, then checks each cell's type once more before
converting (servestack/inference/column_plan.py). Here msgspec parses the body against a schema made once per
model (a row is a tuple of the columns' types: int or float for a float column, int, bool, str), so the type
of every cell, the width of every row and the absence of any other key are proven while parsing, in C; what
is left is one transpose and the conversion itself (`column_plan.typed_arrays`). msgspec yields the same
Python values orjson does for what it accepts (ints stay ints, floats are read to the nearest double). Anything
else (another column order, a null, a boolean in a number column, an unknown key, malformed JSON, a value out
of range) makes the reader decline (None), and the general path decides and names the problem: every refusal
comes from there (tests/unit/test_split_reader.py holds the two paths to the same arrays).
"""

from __future__ import annotations

from typing import Any

import msgspec

from servestack.inference.column_plan import ConversionPlan, conversion_plan, typed_arrays
from servestack.inference.manifest import ColumnSpec, Manifest, numpy_dtype_of

Arrays = dict[str, Any]

# The key a body must name near its start for the reader to try it: other JSON bodies cost one bounded search.
_KEY = b'"dataframe_split"'
_KEY_WITHIN = 64
# A cell's Python type by its column's numpy kind (a string column's dtype is object).
_CELL_TYPES: dict[str, Any] = {"f": int | float, "i": int, "u": int, "b": bool, "O": str}


class SplitReader:
    """The reader of one model's `dataframe_split` bodies (`split_reader` builds it once per model)."""

    __slots__ = ("_decoder", "_names", "_plan")

    def __init__(self, names: list[str], decoder: msgspec.json.Decoder[Any], plan: ConversionPlan) -> None:
        self._names = names
        self._decoder = decoder
        self._plan = plan

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
        return typed_arrays(self._plan, dict(zip(self._names, zip(*data, strict=False), strict=False)), len(data))


def split_reader(manifest: Manifest, specs: tuple[ColumnSpec, ...]) -> SplitReader | None:
    """The reader for a model whose columns are `specs` (`columns.columns_of`); None without columns."""
    if not specs:
        return None
    row = tuple.__class_getitem__(tuple(_CELL_TYPES[numpy_dtype_of(column.dtype).kind] for column in specs))
    split = msgspec.defstruct(
        "Split",
        [("columns", list[str]), ("data", list[row]), ("index", list[Any] | None, None)],  # type: ignore[valid-type]
        forbid_unknown_fields=True,
    )
    request = msgspec.defstruct("SplitRequest", [("dataframe_split", split)], forbid_unknown_fields=True)
    names = [column.name for column in specs]
    return SplitReader(names, msgspec.json.Decoder(request), conversion_plan(manifest, specs))
