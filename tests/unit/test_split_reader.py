"""A `dataframe_split` body of the common kind is read straight into the columns (servestack/inference/split_reader.py).
Whatever the body, the reader either declines it or gives exactly the arrays of the general path (orjson, then
servestack/inference/request_forms.py), which alone refuses and names what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servestack.inference import codecs, media_types, request_forms
from servestack.inference.columns import columns_of
from servestack.inference.grouping import signature, stack
from servestack.inference.manifest import ColumnSpec, Manifest, TensorSpec
from servestack.inference.split_reader import PlannedArrays, split_reader
from tests.unit.test_column_conversion import NAMES, SHA, TABULAR, anything, outcome, plain

READER = split_reader(TABULAR, columns_of(TABULAR))


def general(body: bytes, max_rows: int) -> tuple[str, Any]:
    return outcome(
        lambda: request_forms.json_arrays(codecs.decode_body(body, media_types.JSON), TABULAR, max_rows=max_rows)
    )


@st.composite
def split_bodies(draw: st.DrawFn) -> bytes:
    """A `dataframe_split` body of plain rows in the model's column order, then now and then something else:
    a doubtful cell, the columns in another order, a row of another width, an index, an unknown key, no rows,
    or bytes changed in the text itself."""
    specs = columns_of(TABULAR)
    rows = [[draw(plain[column.dtype]) for column in specs] for _ in range(draw(st.integers(0, 4)))]
    names = list(NAMES)
    split: dict[str, Any] = {"columns": names, "data": rows}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        if rows:
            row = draw(st.sampled_from(rows))
            row[draw(st.integers(0, len(row) - 1))] = draw(anything)
    odd = draw(st.integers(0, 15))
    if odd == 0:
        split["columns"] = draw(st.permutations(names))
    elif odd == 1 and rows:
        rows[0] = rows[0][:-1]
    elif odd == 2:
        split["index"] = list(range(len(rows) + draw(st.sampled_from([0, 0, 1]))))
    elif odd == 3:
        split["extra"] = 1
    elif odd == 4:
        split["index"] = draw(st.sampled_from([None, "i", {}]))
    elif odd == 5:
        split["columns"] = [*names[:-1], names[0]]
    text = json.dumps({"dataframe_split": split}, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    if draw(st.integers(0, 9)) == 0:
        old, new = draw(st.sampled_from(["1", "e", ":", "]", '"'])), draw(st.sampled_from(["", " ", "0", "\\ud800"]))
        text = text.replace(old, new, 1)
    if draw(st.integers(0, 9)) == 0:
        text = text[:-1] + ', "params": {}}'
    return text.encode()


@settings(max_examples=400)
@given(body=split_bodies(), max_rows=st.sampled_from([512, 512, 3]))
def test_the_reader_declines_or_gives_the_general_paths_arrays(body: bytes, max_rows: int) -> None:
    assert READER is not None
    fast = READER.arrays(body, max_rows)
    if fast is not None:
        assert outcome(lambda: fast) == general(body, max_rows)


def test_the_reader_takes_plain_rows_and_declines_what_the_general_path_must_name() -> None:
    assert READER is not None
    row = [1, 2.5, 3.0, 1.5, 1e150, 2**62, 2**31 - 1, 255, True, "Köln"]
    rows = [row, [*row[:-1], "north"]]

    def body(**split: Any) -> bytes:
        return json.dumps({"dataframe_split": {"columns": NAMES, "data": rows} | split}).encode()

    taken = READER.arrays(body(), 512)
    assert taken is not None
    assert outcome(lambda: taken) == general(body(), 512)
    assert READER.arrays(body(index=[7, 8]), 512) is not None
    declined = [
        body(columns=list(reversed(NAMES))),  # another order: the general path maps it
        body(data=[[None, *row[1:]]]),  # a missing value: NaN where allowed, else named
        body(data=[[True, *row[1:]]]),  # a boolean in a number column
        body(data=[[*row[:5], 2**63, *row[6:]]]),  # past int64
        body(data=[[1e39, *row[1:]]]),  # past float32
        body(data=[]),
        body(index=[1]),  # one label for two rows
        body(extra=1),
        body()[:-1],  # malformed
    ]
    for text in declined:
        assert READER.arrays(text, 512) is None, text
    assert READER.arrays(body(), 1) is None  # over the row limit: named by the general path
    assert READER.arrays(b'{"instances": [[1.0]]}', 512) is None


# A pipeline's kind of model (tests/pipeline_model.py): every input one column of the same name, in column order,
# which the reader hands over as the columns themselves (`RowsPlan.single`).
ONE_COLUMN_INPUTS = Manifest(
    name="one-column-inputs",
    version="1",
    sha256=SHA,
    inputs=(
        TensorSpec("length", "float32", (None, 1)),
        TensorSpec("width", "float32", (None, 1)),
        TensorSpec("count", "int64", (None, 1)),
        TensorSpec("site", "string", (None, 1)),
    ),
    outputs=(TensorSpec("y", "float32", (None, 1)),),
    columns=(
        ColumnSpec("length", "float32", "length"),
        ColumnSpec("width", "float32", "width"),
        ColumnSpec("count", "int64", "count"),
        ColumnSpec("site", "string", "site"),
    ),
)


def test_inputs_of_one_column_each_are_the_general_paths_arrays_in_its_order() -> None:
    reader = split_reader(ONE_COLUMN_INPUTS, columns_of(ONE_COLUMN_INPUTS))
    assert reader is not None
    names = ["length", "width", "count", "site"]
    body = json.dumps({"dataframe_split": {"columns": names, "data": [[5.1, 3, 7, "north"], [4.9, 3.5, -2, "é"]]}})
    taken = reader.arrays(body.encode(), 512)
    expected = request_forms.json_arrays(
        codecs.decode_body(body.encode(), media_types.JSON), ONE_COLUMN_INPUTS, max_rows=512
    )
    assert taken is not None
    assert expected is not None
    assert list(taken) == list(expected) == names
    assert outcome(lambda: taken) == outcome(lambda: expected)


# The same kind with its float columns apart and of two dtypes, among columns of other kinds: a float group whose
# columns are not next to each other, and one that is.
INTERLEAVED = Manifest(
    name="interleaved",
    version="1",
    sha256=SHA,
    inputs=(
        TensorSpec("length", "float32", (None, 1)),
        TensorSpec("count", "int64", (None, 1)),
        TensorSpec("width", "float32", (None, 1)),
        TensorSpec("wide", "float64", (None, 1)),
        TensorSpec("flag", "bool", (None, 1)),
        TensorSpec("site", "string", (None, 1)),
    ),
    outputs=(TensorSpec("y", "float32", (None, 1)),),
    columns=(
        ColumnSpec("length", "float32", "length"),
        ColumnSpec("count", "int64", "count"),
        ColumnSpec("width", "float32", "width"),
        ColumnSpec("wide", "float64", "wide"),
        ColumnSpec("flag", "bool", "flag"),
        ColumnSpec("site", "string", "site"),
    ),
)
INTERLEAVED_READER = split_reader(INTERLEAVED, columns_of(INTERLEAVED))
INTERLEAVED_NAMES = [column.name for column in columns_of(INTERLEAVED)]


def generic_signature(arrays: Any) -> Any:
    return signature(dict(arrays))  # a plain dict: worked out from the arrays themselves


def generic_stack(inputs: list[Any]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([arrays[name] for arrays in inputs]) for name in inputs[0]}


@st.composite
def interleaved_bodies(draw: st.DrawFn) -> bytes:
    """Plain rows of INTERLEAVED's columns, now and then a doubtful cell (a value past float64 among them)."""
    specs = columns_of(INTERLEAVED)
    rows = [[draw(plain[column.dtype]) for column in specs] for _ in range(draw(st.integers(1, 5)))]
    if draw(st.integers(0, 4)) == 0:
        row = draw(st.sampled_from(rows))
        row[draw(st.integers(0, len(row) - 1))] = draw(st.one_of(anything, st.just(10**400)))
    return json.dumps({"dataframe_split": {"columns": INTERLEAVED_NAMES, "data": rows}}).encode()


@settings(max_examples=200)
@given(bodies=st.lists(interleaved_bodies(), min_size=1, max_size=4), plain_first=st.booleans())
def test_the_readers_arrays_batch_as_the_general_paths_do(bodies: list[bytes], plain_first: bool) -> None:
    """Each body is declined or read as the general path reads it, with the signature the batcher would work
    out; a batch of them (`grouping.stack`) holds the same arrays as one joined column by column, each input
    contiguous, in the same order, whether or not a plain dict of the general path is among them."""
    assert INTERLEAVED_READER is not None
    taken: list[dict[str, np.ndarray]] = []
    for body in bodies:
        fast = INTERLEAVED_READER.arrays(body, 512)
        general_arrays = outcome(
            lambda body=body: request_forms.json_arrays(
                codecs.decode_body(body, media_types.JSON), INTERLEAVED, max_rows=512
            )
        )
        if fast is None:
            continue
        assert type(fast) is PlannedArrays
        assert outcome(lambda fast=fast: fast) == general_arrays
        assert list(fast) == INTERLEAVED_NAMES
        assert signature(fast) == generic_signature(fast)
        taken.append(fast)
    if not taken:
        return
    if plain_first:
        taken.insert(0, dict(taken[0]))  # a request of the general path in the same batch
    joined, expected = stack(taken), generic_stack(taken)
    assert list(joined) == list(expected)
    assert outcome(lambda: joined) == outcome(lambda: expected)
    assert all(array.flags.c_contiguous for array in joined.values())


def test_an_integer_past_float64_in_a_float_column_is_declined() -> None:
    assert INTERLEAVED_READER is not None
    row = [10**400, 1, 2.5, 1.0, True, "north"]
    body = json.dumps({"dataframe_split": {"columns": INTERLEAVED_NAMES, "data": [row]}}).encode()
    assert INTERLEAVED_READER.arrays(body, 512) is None
    assert (
        outcome(
            lambda: request_forms.json_arrays(codecs.decode_body(body, media_types.JSON), INTERLEAVED, max_rows=512)
        )[0]
        == "refused"
    )
