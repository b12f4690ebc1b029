"""Named columns: the manifest's column model, `servestack/inference/columns.py`, and every request form that addresses
columns by name (servestack/inference/request_forms.py), on a real ONNX model pushed with `--columns`
(tests/tabular_fixtures.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest

from servestack.inference import answers, codecs, input_checks, media_types
from servestack.inference.columns import arrays_from_columns, columns_from_records, columns_from_split, columns_of
from servestack.inference.errors import InvalidInput, ModelLoadError
from servestack.inference.manifest import ColumnSpec, Manifest, read_manifest
from servestack.inference.service import ServedModel
from tests.conftest import ARTIFACTS
from tests.tabular_fixtures import summing_package

DIGITS = read_manifest(ARTIFACTS / "digits" / "1")
ROWS = [[1.5, 2.0, -3.0], [4.0, 0.25, 6.0]]


@pytest.fixture(scope="module")
def summing(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return summing_package(tmp_path_factory.mktemp("summing"))


@pytest.fixture(scope="module")
def summing_nan(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return summing_package(tmp_path_factory.mktemp("summing-nan"), allow_nan=["b"])


def manifest_with(**changes: Any) -> Manifest:
    fields = {name: getattr(DIGITS, name) for name in DIGITS.__struct_fields__}
    return Manifest(**fields | changes)


def refusal(call: Any) -> dict[str, Any]:
    with pytest.raises(InvalidInput) as caught:
        call()
    described: dict[str, Any] = caught.value.to_dict()
    return described


# ------------------------------------------------------------------------------------------ the manifest


def test_a_manifest_written_before_columns_loads_unchanged_and_is_not_tabular() -> None:
    # GIVEN the committed digits manifest (string labels, one [N, 64] input, no columns)
    # THEN it loads as it did, and has no columns: its requests stay tensors
    assert DIGITS.labels is not None
    assert DIGITS.labels[0] == "0"
    assert DIGITS.columns is None
    assert columns_of(DIGITS) == ()


def test_push_with_columns_records_them_with_indexes_dtypes_and_nan(summing_nan: ServedModel) -> None:
    manifest = summing_nan.manifest
    assert manifest.columns == (
        ColumnSpec("a", "float32", "x", 0),
        ColumnSpec("b", "float32", "x", 1, allow_nan=True),
        ColumnSpec("c", "float32", "x", 2),
    )
    document = json.loads(manifest.to_json())
    assert document["columns"][0] == {"name": "a", "dtype": "float32", "input": "x", "index": 0}


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        ([ColumnSpec("a", "float32", "nope")], "input 'nope' is not one of"),
        ([ColumnSpec("a", "float32", "input", 0), ColumnSpec("a", "float32", "input", 1)], "named twice"),
        ([ColumnSpec(f"c{i}", "float32", "input", i) for i in range(63)], "indexes 0..63"),
        ([ColumnSpec(f"c{i}", "int64", "input", i) for i in range(64)], "dtype int64, but input 'input'"),
        ([ColumnSpec("c", "float32", "input")], "its columns need the indexes"),
    ],
)
def test_a_manifest_with_inconsistent_columns_is_refused_naming_the_problem(
    tmp_path: Path, columns: list[ColumnSpec], problem: str
) -> None:
    # GIVEN a manifest.json whose columns do not fit its inputs
    document = json.loads(DIGITS.to_json())
    document["columns"] = [msgspec.to_builtins(column) for column in columns]
    (tmp_path / "manifest.json").write_text(json.dumps(document))
    # WHEN it is read THEN the load fails saying what is wrong
    with pytest.raises(ModelLoadError, match=problem):
        read_manifest(tmp_path)


def test_every_input_of_shape_n_by_1_is_a_column_named_after_it() -> None:
    inputs = tuple(
        msgspec.convert({"name": n, "dtype": d, "shape": [None, 1]}, type=DIGITS.inputs[0].__class__)
        for n, d in (("age", "float32"), ("city", "string"), ("visits", "int64"))
    )
    manifest = manifest_with(inputs=inputs, allow_non_finite=True)
    assert [(c.name, c.dtype, c.input, c.index, c.allow_nan) for c in columns_of(manifest)] == [
        ("age", "float32", "age", None, True),
        ("city", "string", "city", None, False),
        ("visits", "int64", "visits", None, False),
    ]


# ------------------------------------------------------------------------------------------ columns -> arrays


def test_columns_in_any_order_assemble_the_input_in_column_order(summing: ServedModel) -> None:
    arrays = arrays_from_columns(summing.manifest, {"c": [-3.0, 6], "a": [1.5, 4], "b": [2, 0.25]}, field="inputs")
    np.testing.assert_array_equal(arrays["x"], np.array(ROWS, np.float32))
    assert arrays["x"].dtype == np.float32


@pytest.mark.parametrize(
    ("columns", "named", "field"),
    [
        ({"a": [1.0], "b": [2.0]}, "missing column 'c'", "inputs"),
        ({"a": [1.0], "b": [2.0], "c": [3.0], "d": [4.0]}, "unknown column 'd'", "inputs.d"),
    ],
)
def test_a_missing_or_unknown_column_is_named_with_the_expected_ones(
    summing: ServedModel, columns: dict[str, list[float]], named: str, field: str
) -> None:
    error = refusal(lambda: arrays_from_columns(summing.manifest, columns, field="inputs"))
    assert named in error["message"]
    assert "['a', 'b', 'c']" in error["message"]
    assert error["field"] == field
    assert error["allowed"] == "a, b, c"


@pytest.mark.parametrize(
    ("values", "field", "said"),
    [
        ([1.0, "2"], "inputs.b[1]", "'2' (str) is not allowed; column 'b' takes numbers"),
        ([1.0, True], "inputs.b[1]", "True (bool) is not allowed"),
        ([None, 1.0], "inputs.b[0]", "a missing value is not allowed; column 'b'"),
        ([1.0, math.nan], "inputs.b[1]", "NaN is not allowed; column 'b'"),
        ([1.0, 1e39], "inputs.b[1]", "does not fit column 'b' (float32)"),
        ([1.0], "inputs.b", "1 values, column 'a' has 2"),
        ("12", "inputs.b", "expected a list of values, one per row, got str"),
    ],
)
def test_a_bad_value_is_named_by_column_and_row(summing: ServedModel, values: list[Any], field: str, said: str) -> None:
    columns = {"a": [1.0, 2.0], "b": values, "c": [3.0, 4.0]}
    error = refusal(lambda: arrays_from_columns(summing.manifest, columns, field="inputs"))
    assert error["field"] == field
    assert said in error["message"]


def test_nan_and_null_pass_where_the_column_allows_them_only(summing_nan: ServedModel) -> None:
    arrays = arrays_from_columns(
        summing_nan.manifest, {"a": [1.0, 2.0], "b": [None, math.nan], "c": [3.0, 4.0]}, field="inputs"
    )
    assert np.isnan(arrays["x"][:, 1]).all()
    error = refusal(
        lambda: arrays_from_columns(summing_nan.manifest, {"a": [None], "b": [1.0], "c": [3.0]}, field="inputs")
    )
    assert error["field"] == "inputs.a[0]"
    assert "--allow-nan a" in error["message"]


def test_string_and_integer_columns_keep_their_kind() -> None:
    spec = DIGITS.inputs[0].__class__
    inputs = (
        spec("city", "string", (None, 1)),
        spec("visits", "int64", (None, 1)),
    )
    manifest = manifest_with(inputs=inputs)
    arrays = arrays_from_columns(manifest, {"visits": [3, 2**40], "city": ["Lyon", "Köln"]}, field="inputs")
    assert arrays["city"].dtype == object
    assert arrays["city"].tolist() == [["Lyon"], ["Köln"]]
    assert arrays["visits"].dtype == np.int64
    assert arrays["visits"].tolist() == [[3], [2**40]]
    assert (
        "'3' (str)"
        in refusal(lambda: arrays_from_columns(manifest, {"visits": ["3"], "city": ["x"]}, field="inputs"))["message"]
    )
    assert (
        "1.5 (float)"
        in refusal(lambda: arrays_from_columns(manifest, {"visits": [1.5], "city": ["x"]}, field="inputs"))["message"]
    )
    assert (
        "3 (int)"
        in refusal(lambda: arrays_from_columns(manifest, {"visits": [1], "city": [3]}, field="inputs"))["message"]
    )


def test_records_and_split_become_the_same_columns() -> None:
    records = columns_from_records([{"b": 2, "a": 1}, {"a": 3, "b": 4}], field="dataframe_records")
    split = columns_from_split({"columns": ["a", "b"], "data": [[1, 2], [3, 4]], "index": [7, 8]}, field="s")
    assert records == {name: list(values) for name, values in split.items()} == {"a": [1, 3], "b": [2, 4]}
    uneven = refusal(lambda: columns_from_records([{"a": 1}, {"b": 2}], field="dataframe_records"))
    assert uneven["field"] == "dataframe_records[1]"
    assert "'a'" in uneven["message"]
    short = refusal(lambda: columns_from_split({"columns": ["a", "b"], "data": [[1]]}, field="dataframe_split"))
    assert short["field"] == "dataframe_split.data[0]"


# ------------------------------------------------------------------------------------------ every form, one model


def bodies() -> dict[str, tuple[bytes, str]]:
    """The same two rows in every form the summing model takes, with its content type."""
    names = ["a", "b", "c"]
    records = [dict(zip(names, row, strict=True)) for row in ROWS]
    reversed_records = [{name: record[name] for name in reversed(names)} for record in records]
    columns = {name: [row[i] for row in ROWS] for i, name in enumerate(names)}
    csv_rows = "\n".join(",".join(str(v) for v in row) for row in ROWS)
    swapped = "c,a,b\n" + "\n".join(f"{row[2]},{row[0]},{row[1]}" for row in ROWS)
    return {
        "instances": (orjson.dumps({"instances": ROWS}), media_types.JSON),
        "dataframe_split": (orjson.dumps({"dataframe_split": {"columns": names, "data": ROWS}}), media_types.JSON),
        "dataframe_records": (orjson.dumps({"dataframe_records": reversed_records}), media_types.JSON),
        "instances of objects": (orjson.dumps({"instances": records}), media_types.JSON),
        "inputs by column": (orjson.dumps({"inputs": columns}), media_types.JSON),
        "inputs by tensor": (orjson.dumps({"inputs": {"x": ROWS}}), media_types.JSON),
        "csv": (csv_rows.encode(), media_types.CSV),
        "csv with its header": (("a,b,c\n" + csv_rows).encode(), media_types.CSV),
        "csv, header=present": (swapped.encode(), media_types.CSV_HEADER),
        ".npy": (codecs.encode_npy([np.array(ROWS, np.float32)]), media_types.NPY),
    }


@pytest.mark.parametrize("form", sorted(bodies()))
def test_every_form_gives_the_same_arrays_and_the_same_answer(summing: ServedModel, form: str) -> None:
    body, content_type = bodies()[form]
    arrays = summing.decode(body, content_type)
    np.testing.assert_array_equal(arrays["x"], np.array(ROWS, np.float32))
    answer = orjson.loads(summing.answer(summing.predict(arrays), media_types.JSON).body)
    assert answer["predictions"] == [0.5, 10.25]  # flat: one target, one value per row


def test_nan_reaches_a_model_that_allows_it_in_every_spelling(summing_nan: ServedModel) -> None:
    spelled = {
        "null": (b'{"dataframe_records": [{"a": 1, "b": null, "c": 2}]}', media_types.JSON),
        "NaN": (b'{"dataframe_split": {"columns": ["a","b","c"], "data": [[1, NaN, 2]]}}', media_types.JSON),
        "rows": (b'{"instances": [[1, null, 2]]}', media_types.JSON),
        "empty cell": (b"1,,2\n", media_types.CSV),
        "NaN cell": (b"a,b,c\n1,NaN,2\n", media_types.CSV),
    }
    for name, (body, content_type) in spelled.items():
        row = summing_nan.decode(body, content_type)["x"][0]
        np.testing.assert_array_equal(row, np.array([1, np.nan, 2], np.float32), err_msg=name)
    error = refusal(lambda: summing_nan.decode(b"a,b,c\n,1,2\n", media_types.CSV))
    assert error["field"] == "csv.a[0]"


def test_a_model_without_named_columns_says_how_to_name_them() -> None:
    from servestack.inference.service import ModelRepository
    from servestack.inference.settings import ServingSettings

    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    digits = repository.get("digits")
    body = orjson.dumps({"dataframe_split": {"columns": ["a"], "data": [[1]]}})
    error = refusal(lambda: digits.decode(body, media_types.JSON))
    assert "has no named columns" in error["message"]
    assert "--columns" in error["allowed"]


def test_two_forms_in_one_body_are_refused(summing: ServedModel) -> None:
    body = orjson.dumps({"dataframe_records": [{"a": 1, "b": 2, "c": 3}], "instances": [[1, 2, 3]]})
    assert "exactly one of" in refusal(lambda: summing.decode(body, media_types.JSON))["message"]


# ------------------------------------------------------------------------------------------ answers


def test_csv_answers_write_float32_at_its_shortest_and_a_header_when_asked() -> None:
    fields = {
        "predictions": np.array(["yes", "no, never"], dtype=object),
        "probabilities": np.array([[0.25, 197.45694], [1.0, 1e-8]], np.float32),
    }
    assert answers.encode_response(fields, media_types.CSV).body == b'yes,0.25,197.45694\n"no, never",1,1e-08\n'
    with_header = answers.encode_response(fields, media_types.CSV_HEADER, ("no", "yes"))
    assert with_header.body.splitlines()[0] == b"prediction,proba_no,proba_yes"
    assert with_header.media_type == media_types.CSV_HEADER
    regression = answers.encode_response({"predictions": np.array([[197.45694], [2.5]], np.float32)}, media_types.CSV)
    assert regression.body == b"197.45694\n2.5\n"


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, media_types.JSON),
        ("text/csv; header=present", media_types.CSV_HEADER),
        ("text/csv;header=absent", media_types.CSV),
        ("application/json; probabilities=by-label", media_types.JSON_BY_LABEL),
        ("text/csv;q=0.1, application/json;probabilities=by-label", media_types.JSON_BY_LABEL),
        ("application/x-npy, text/csv; header=present;q=0.5", media_types.NPY),
    ],
)
def test_answer_types_keep_the_parameters_that_change_the_answer(accept: str | None, chosen: str) -> None:
    assert media_types.answer_type_of(accept) == chosen


def test_probabilities_keyed_by_label_and_integer_labels_named_by_their_value() -> None:
    manifest = manifest_with(
        labels=(3, 5, 7),
        outputs=(DIGITS.outputs[0], DIGITS.outputs[1].__class__("probabilities", "float32", (None, 3))),
    )
    outputs = {"label": np.array([5, 7]), "probabilities": np.array([[0.5, 0.25, 0.25], [0, 0, 1]], np.float32)}
    fields = answers.default_response(manifest, outputs, by_label=True)
    assert fields["labels"] == [5, 7]
    written = orjson.loads(answers.encode_response(fields, media_types.JSON_BY_LABEL).body)
    assert written["probabilities"] == [{"3": 0.5, "5": 0.25, "7": 0.25}, {"3": 0.0, "5": 0.0, "7": 1.0}]
    plan = answers.answer_plan(manifest)
    assert plan is not None
    assert (
        answers.json_answer(plan, outputs)
        == answers.encode_response(answers.default_response(manifest, outputs), media_types.JSON).body
    )


def test_a_string_input_takes_numpy_arrays_of_str_or_of_str_objects() -> None:
    # GIVEN a model with a string input [N, 1], fed as a preprocess hook feeds it (an array per input)
    spec = DIGITS.inputs[0].__class__
    manifest = manifest_with(inputs=(spec("city", "string", (None, 1)),))
    for given in (np.array([["Lyon"], ["Köln am Rhein"]]), np.array([["Lyon"], ["Köln am Rhein"]], dtype=object)):
        # WHEN it is validated THEN it becomes the object array onnxruntime takes, of the same strings
        arrays = input_checks.validate_inputs({"city": ("inputs.city", given)}, manifest, max_batch_rows=10)
        assert arrays["city"].dtype == object
        assert arrays["city"].tolist() == [["Lyon"], ["Köln am Rhein"]]
    # AND an object array holding anything but str is refused, naming the element
    mixed = np.array([["Lyon"], [3]], dtype=object)
    error = refusal(lambda: input_checks.validate_inputs({"city": ("inputs.city", mixed)}, manifest, max_batch_rows=10))
    assert error["field"] == "inputs.city[1][0]"
    assert "3 (int) is not allowed; input 'city' takes strings" in error["message"]
    wrong_shape = np.array(["Lyon", "Köln"])
    assert (
        "single row"
        in refusal(
            lambda: input_checks.validate_inputs({"city": ("inputs.city", wrong_shape)}, manifest, max_batch_rows=10)
        )["message"]
    )
