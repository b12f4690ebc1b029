"""`arrays_from_columns` takes a shortcut for JSON columns of plainly valid values
(servestack/inference/column_plan.py). For any columns at all, it must accept exactly what the column-by-column path
accepts, with the same arrays, and refuse
the rest with that path's own error (field, value, allowed and message).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servestack.inference.column_plan import conversion_plan, planned_arrays
from servestack.inference.columns import arrays_column_by_column, arrays_from_columns, columns_of
from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import ColumnSpec, Manifest, TensorSpec

SHA = "0" * 64
# One input of each kind the shortcut plans for: a [N, 3] float32 input of named columns (one of them allowing
# NaN), and [N, 1] inputs of float16, float64, int64, int32, uint8, bool and string.
TABULAR = Manifest(
    name="tabular",
    version="1",
    sha256=SHA,
    inputs=(
        TensorSpec("x", "float32", (None, 3)),
        TensorSpec("half", "float16", (None, 1)),
        TensorSpec("wide", "float64", (None, 1)),
        TensorSpec("count", "int64", (None, 1)),
        TensorSpec("small", "int32", (None, 1)),
        TensorSpec("byte", "uint8", (None, 1)),
        TensorSpec("flag", "bool", (None, 1)),
        TensorSpec("site", "string", (None, 1)),
    ),
    outputs=(TensorSpec("y", "float32", (None, 1)),),
    columns=(
        ColumnSpec("c", "float32", "x", 2),
        ColumnSpec("a", "float32", "x", 0),
        ColumnSpec("b", "float32", "x", 1, allow_nan=True),
        ColumnSpec("half", "float16", "half"),
        ColumnSpec("wide", "float64", "wide"),
        ColumnSpec("count", "int64", "count"),
        ColumnSpec("small", "int32", "small"),
        ColumnSpec("byte", "uint8", "byte"),
        ColumnSpec("flag", "bool", "flag"),
        ColumnSpec("site", "string", "site"),
    ),
)
NAMES = [column.name for column in columns_of(TABULAR)]

# The values each column usually holds, and every kind of value a JSON body (or a hook) can put in any column.
plain = {
    "float16": st.floats(-60000, 60000, allow_nan=False),
    "float32": st.one_of(st.integers(-(10**9), 10**9), st.floats(-1e30, 1e30, allow_nan=False)),
    "float64": st.one_of(st.integers(-(10**18), 10**18), st.floats(-1e150, 1e150)),  # larger: checked value by value
    "int64": st.integers(-(2**63), 2**63 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "uint8": st.integers(0, 255),
    "bool": st.booleans(),
    "string": st.text(max_size=8),
}
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**1100),
    st.floats(),  # NaN and infinities included
    st.floats(min_value=1e30, max_value=1e308),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(["1.5", "nan", "true"]),
    st.sampled_from([True, False, 256, -1, 2**31, -(2**31) - 1, 2**63, 70000.0, 1e39, 1e300]),  # at each edge
)


@st.composite
def columns_of_values(draw: st.DrawFn) -> dict[str, Any]:
    """Columns of the TABULAR model, of plain values (so the shortcut is taken), then now and then one or two
    values of any kind in any column, a column of another length, a missing or an extra column, or a column
    that is no list."""
    rows = draw(st.integers(0, 4))
    columns: dict[str, Any] = {}
    for column in columns_of(TABULAR):
        values = draw(st.lists(plain[column.dtype], min_size=rows, max_size=rows))
        columns[column.name] = tuple(values) if draw(st.booleans()) else values  # split's tuples, records' lists
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
        name = draw(st.sampled_from(NAMES))
        if columns[name]:
            values = list(columns[name])
            values[draw(st.integers(0, len(values) - 1))] = draw(anything)
            columns[name] = values
    odd = draw(st.integers(0, 19))
    name = draw(st.sampled_from(NAMES))
    if odd == 0:
        columns[name] = columns[name][:-1] if columns[name] else [1]
    elif odd == 1:
        del columns[name]
    elif odd == 2:
        columns["extra"] = [1.0] * rows
    elif odd == 3:
        columns[name] = draw(st.one_of(st.none(), st.text(max_size=3), st.integers()))
    return columns


def outcome(convert: Any) -> tuple[str, Any]:
    try:
        arrays = convert()
    except InvalidInput as error:
        return "refused", error.to_dict()
    return "arrays", {name: (array.dtype, array.shape, _cells(array)) for name, array in arrays.items()}


def _cells(array: np.ndarray) -> list[Any]:
    """The values, with NaN written as a marker (NaN != NaN) and each float tagged as such (1.0 == 1 == True)."""
    return [
        ("nan",) if isinstance(value, float) and math.isnan(value) else (type(value).__name__, value)
        for value in array.reshape(-1).tolist()
    ]


@settings(max_examples=400)  # quick (no model runs), and most doubtful values are in one column of ten
@given(columns=columns_of_values(), max_rows=st.sampled_from([None, None, 3]))
def test_the_shortcut_accepts_and_refuses_exactly_what_each_column_alone_does(
    columns: dict[str, Any], max_rows: int | None
) -> None:
    shortcut = outcome(lambda: arrays_from_columns(TABULAR, columns, field="inputs", max_rows=max_rows))
    alone = outcome(lambda: arrays_column_by_column(TABULAR, columns, field="inputs", max_rows=max_rows))
    assert shortcut == alone


def test_the_shortcut_is_taken_for_plain_values_and_declines_anything_doubtful() -> None:
    # GIVEN plain values in every column, then one doubtful value at a time
    plan = conversion_plan(TABULAR, columns_of(TABULAR))
    base: dict[str, list[Any]] = {
        "a": [1, 2.5],
        "b": [0.5, -1e30],
        "c": [3.0, 4.0],
        "half": [1.5, 2.0],
        "wide": [1e150, -2.0],
        "count": [2**62, -3],
        "small": [2**31 - 1, -(2**31)],
        "byte": [0, 255],
        "flag": [True, False],
        "site": ["north", "Köln"],
    }
    # THEN the shortcut takes the plain columns, with the [N, 3] input in column order
    arrays = planned_arrays(plan, base, None)
    assert arrays is not None
    assert arrays["x"].dtype == np.float32
    assert arrays["x"].tolist() == [[1.0, 0.5, 3.0], [2.5, np.float32(-1e30), 4.0]]
    assert arrays["site"].dtype == object
    assert arrays["flag"].dtype == bool
    # AND declines each doubtful value, leaving it to the column-by-column path (which takes NaN in `b`)
    doubtful = [
        ("b", [None, 1.0]),
        ("b", [math.nan, 1.0]),
        ("a", [True, 1.0]),
        ("a", ["1.5", 1.0]),
        ("a", [1e39, 1.0]),
        ("half", [70000.0, 1.0]),
        ("wide", [math.inf, 1.0]),
        ("wide", [1e300, 1.0]),  # its square is past float64: checked value by value
        ("count", [2**63, 1]),
        ("count", [1.0, 1]),
        ("small", [2**31, 1]),
        ("byte", [-1, 1]),
        ("flag", [1, True]),
        ("site", [1, "north"]),
    ]
    for name, values in doubtful:
        assert planned_arrays(plan, base | {name: values}, None) is None, (name, values)
    assert planned_arrays(plan, base, 1) is None  # over max_rows
    assert planned_arrays(plan, base | {"a": np.array([1.0, 2.0])}, None) is None  # an array: checked alone
    assert np.isnan(arrays_from_columns(TABULAR, base | {"b": [None, math.nan]}, field="inputs")["x"][:, 1]).all()


@pytest.mark.parametrize("form", ["tuple", "list"])
def test_a_refusal_names_the_column_row_and_value_as_before(form: str) -> None:
    values: Any = (1.0, "2") if form == "tuple" else [1.0, "2"]
    base = {name: [1] * 2 for name in NAMES} | {"site": ["a", "b"], "flag": [True, False], "a": values}
    with pytest.raises(InvalidInput) as caught:
        arrays_from_columns(TABULAR, base, field="dataframe_split")
    assert caught.value.to_dict()["field"] == "dataframe_split.a[1]"
    assert "'2' (str) is not allowed; column 'a' takes numbers" in caught.value.message
