"""Codecs: every wire format decodes to the same arrays; every bad input names field, value and what's allowed."""

from __future__ import annotations

import io
import json

import numpy as np
import orjson
import pytest

from servestack.inference import answers, codecs, fast_paths, input_checks, media_types
from servestack.inference.errors import InvalidInput, NotAcceptable, UnsupportedMediaType
from servestack.inference.manifest import Manifest, TensorSpec, read_manifest
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS

DIGITS = read_manifest(ARTIFACTS / "digits" / "1")


def decode(body: bytes, content_type: str = media_types.JSON, max_batch_rows: int = 10_000) -> np.ndarray:
    raw = codecs.payload_to_arrays(codecs.decode_body(body, content_type), content_type, DIGITS)
    return input_checks.validate_inputs(raw, DIGITS, max_batch_rows=max_batch_rows)["input"]


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


ROWS = np.arange(2 * 64, dtype=np.float32).reshape(2, 64) % 17


def test_json_csv_and_npy_decode_to_the_same_array() -> None:
    from_json = decode(orjson.dumps({"instances": ROWS.tolist()}))
    from_named = decode(orjson.dumps({"inputs": {"input": ROWS.tolist()}}))
    from_csv = decode("\n".join(",".join(str(v) for v in row) for row in ROWS).encode(), media_types.CSV)
    from_npy = decode(npy(ROWS), media_types.NPY)
    for array in (from_json, from_named, from_csv, from_npy):
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, ROWS)


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(3e38, np.float64), (1e20, np.float32), (-3.4e38, np.float32)],
    ids=["float64-near-float32-max", "float32-whose-square-overflows", "float32-max-negative"],
)
def test_values_whose_squares_overflow_are_still_accepted_when_they_fit(value: float, dtype: type) -> None:
    # GIVEN rows of large values that fit float32, but whose sum of squares passes float32 max squared (or
    # overflows in float32): the one-call range check cannot vouch for them and must hand them on
    rows = np.full((2, 64), value, dtype=dtype)
    model = ServedModel.load(ARTIFACTS / "digits" / "1", ServingSettings(warmup=False))
    for body, content_type in (
        (npy(rows), media_types.NPY),
        (orjson.dumps({"instances": rows.tolist()}), media_types.JSON),
    ):
        # WHEN they are decoded by the fast path's caller and by the general path
        fast = model.decode(body, content_type)["input"]
        general = decode(body, content_type)
        # THEN both accept them, with the same float32 values
        assert fast.dtype == general.dtype == np.float32
        np.testing.assert_array_equal(fast, rows.astype(np.float32))
        np.testing.assert_array_equal(general, rows.astype(np.float32))


def test_a_value_past_float32_max_is_refused_by_name() -> None:
    rows = np.ones((2, 64))
    rows[1, 3] = 3.5e38
    assert invalid(npy(rows), media_types.NPY).field == "body[1][3]"
    assert invalid(orjson.dumps({"instances": rows.tolist()})).field == "instances[1][3]"


def test_integers_and_float64_npy_are_cast_to_the_model_dtype() -> None:
    assert decode(orjson.dumps({"instances": [[1] * 64]})).dtype == np.float32
    assert decode(npy(ROWS.astype(np.float64)), media_types.NPY).dtype == np.float32


def invalid(body: bytes, content_type: str = media_types.JSON) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        decode(body, content_type)
    return caught.value


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        (b'{"instances": [[1, 2', "body", None),
        (b"[1, 2, 3]", "body", "list"),
        (b'{"rows": []}', "body", ["rows"]),
        (orjson.dumps({"instances": [[0.0] * 63]}), "instances[0]", 63),
        (orjson.dumps({"instances": [[0.0] * 65]}), "instances[0]", 65),
        (orjson.dumps({"instances": [[0.0] * 64, [0.0] * 63]}), "instances[1]", 63),
        (orjson.dumps({"instances": [[0.0] * 10 + ["seven"] + [0.0] * 53]}), "instances[0][10]", "seven"),
        (orjson.dumps({"instances": [[0.0] * 10 + ["7"] + [0.0] * 53]}), "instances[0][10]", "7"),
        (orjson.dumps({"instances": [[True] * 64]}), "instances[0][0]", True),
        (orjson.dumps({"instances": [[0.0] * 5 + [None] + [0.0] * 58]}), "instances[0][5]", None),
        (json.dumps({"instances": [[0.0] * 3 + [float("nan")] + [0.0] * 60]}).encode(), "instances[0][3]", "nan"),
        (json.dumps({"instances": [[float("inf")] + [0.0] * 63]}).encode(), "instances[0][0]", "inf"),
        (orjson.dumps({"instances": []}), "instances", []),
        (orjson.dumps({"instances": [0.0] * 64}), "instances", "shape [64]"),
        (orjson.dumps({"instances": "0,1,2"}), "instances", "0,1,2"),
        (orjson.dumps({"inputs": {"pixels": [[0.0] * 64]}}), "inputs", ["pixels"]),
    ],
    ids=[
        "malformed-json",
        "not-an-object",
        "neither-instances-nor-inputs",
        "63-features",
        "65-features",
        "ragged-second-row",
        "string-feature",
        "numeric-string-feature",
        "bool-row",
        "null-feature",
        "nan",
        "infinity",
        "empty-batch",
        "flat-row",
        "string-instances",
        "unknown-input-name",
    ],
)
def test_bad_json_names_field_and_value(body: bytes, field: str, value: object) -> None:
    error = invalid(body)
    assert error.status_code == 400
    assert error.field == field
    if value is not None:
        assert error.to_dict()["value"] == value
    assert error.allowed


def test_bad_csv_cell_names_line_and_column() -> None:
    error = invalid(b"0," * 63 + b"0\n" + b"0," * 20 + b"x," + b"0," * 42 + b"0\n", media_types.CSV)
    assert error.field == "csv line 2 column 21"
    assert error.value == "x"


def test_csv_with_wrong_width_names_the_line() -> None:
    assert invalid(b"1,2,3\n", media_types.CSV).field == "csv line 1"


def test_empty_csv_is_an_empty_batch() -> None:
    assert "empty batch" in invalid(b"\n", media_types.CSV).message


def test_npy_never_unpickles() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert invalid(buffer.getvalue(), media_types.NPY).field == "body"


def test_npy_nan_is_refused() -> None:
    rows = ROWS.copy()
    rows[1, 7] = np.nan
    assert invalid(npy(rows), media_types.NPY).field == "body[1][7]"


def test_garbage_npy_is_invalid_input() -> None:
    assert invalid(b"\x93NUMPY garbage", media_types.NPY).status_code == 400


def test_batch_over_the_row_limit_is_refused() -> None:
    with pytest.raises(InvalidInput, match="over the limit"):
        decode(orjson.dumps({"instances": ROWS.tolist()}), max_batch_rows=1)


def test_unsupported_content_type_lists_the_supported_ones() -> None:
    with pytest.raises(UnsupportedMediaType) as caught:
        codecs.decode_body(b"x", "text/plain")
    assert caught.value.status_code == 415
    assert caught.value.allowed == "application/json, text/csv, application/x-npy"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, media_types.JSON),
        ("*/*", media_types.JSON),
        ("text/csv", media_types.CSV),
        ("application/x-npy", media_types.NPY),
        ("image/png, text/csv;q=0.5", media_types.CSV),
        ("application/json; charset=utf-8", media_types.JSON),
    ],
)
def test_accept_negotiation(accept: str | None, expected: str) -> None:
    assert media_types.negotiate(accept) == expected


def test_unwritable_accept_is_406() -> None:
    with pytest.raises(NotAcceptable) as caught:
        media_types.negotiate("image/png")
    assert caught.value.status_code == 406


def test_media_type_ignores_parameters() -> None:
    assert media_types.media_type_of("Application/JSON; charset=utf-8") == media_types.JSON
    assert media_types.media_type_of(None) == media_types.JSON


def test_responses_in_every_format_carry_the_same_predictions() -> None:
    outputs = {"label": np.array([3, 1]), "probabilities": np.eye(10, dtype=np.float32)[[3, 1]]}
    fields = answers.default_response(DIGITS, outputs)
    as_json = orjson.loads(answers.encode_response(fields, media_types.JSON).body)
    as_csv = answers.encode_response(fields, media_types.CSV).body.decode().splitlines()
    as_npy = np.load(io.BytesIO(answers.encode_response(fields, media_types.NPY).body))
    assert as_json["predictions"] == [3, 1]
    assert as_json["labels"] == ["3", "1"]
    assert [line.split(",")[0] for line in as_csv] == ["3", "1"]
    assert as_csv[0].split(",")[1:] == ["0", "0", "0", "1", "0", "0", "0", "0", "0", "0"]
    np.testing.assert_array_equal(as_npy, [3, 1])


@pytest.mark.parametrize(
    "array",
    [
        ROWS,
        ROWS.astype(">f4"),  # big-endian
        np.asfortranarray(ROWS),  # Fortran order goes through np.load
        ROWS.astype(np.int64),
    ],
    ids=["c-order", "big-endian", "fortran-order", "int64"],
)
def test_every_npy_layout_reads_the_same_values(array: np.ndarray) -> None:
    np.testing.assert_array_equal(decode(npy(array), media_types.NPY), ROWS)


def test_npy_version_2_header_is_read() -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, ROWS, version=(2, 0))
    np.testing.assert_array_equal(decode(buffer.getvalue(), media_types.NPY), ROWS)


def test_truncated_npy_is_invalid_input() -> None:
    assert invalid(npy(ROWS)[:-7], media_types.NPY).field == "body"


FAST_PATH_BODIES = [
    {"instances": ROWS.tolist()},
    {"instances": [[1] * 64]},
    {"instances": [[0.0] * 63]},
    {"instances": [[0.0] * 65]},
    {"instances": [[0.0] * 10 + ["7"] + [0.0] * 53]},
    {"instances": [[True] * 64]},
    {"instances": [[1e39] * 64]},  # overflows float32 to infinity
    {"instances": []},
    {"instances": [0.0] * 64},
    {"instances": [[0.0] * 64, [0.0] * 63]},
    {"inputs": {"input": ROWS.tolist()}},
    {"instances": ROWS.tolist(), "extra": 1},
    {"instances": [[1.0] * 63 + [True]]},  # numpy would read the boolean as 1.0
    {"instances": [[1] * 63 + [False]]},
]


@pytest.mark.parametrize("document", FAST_PATH_BODIES)
def test_the_fast_path_accepts_exactly_what_the_general_path_accepts(document: dict[str, object]) -> None:
    body = orjson.dumps(document)
    booleans = fast_paths.may_hold_booleans(body)
    fast = fast_paths.fast_instances(document, DIGITS, max_batch_rows=10_000, may_hold_booleans=booleans)
    try:
        general = input_checks.validate_inputs(
            codecs.payload_to_arrays(document, media_types.JSON, DIGITS),
            DIGITS,
            max_batch_rows=10_000,
            may_hold_booleans=booleans,
        )
    except InvalidInput:
        assert fast is None
        return
    if fast is not None:
        assert fast.keys() == general.keys()
        np.testing.assert_array_equal(fast["input"], general["input"])
        assert fast["input"].dtype == general["input"].dtype


NPY_FAST_PATH_ARRAYS = [
    ROWS,
    ROWS.astype(np.float64),
    ROWS.astype(">f4"),
    ROWS.astype(np.int64),
    ROWS.astype(np.uint8),
    ROWS.astype(bool),  # a boolean is not a number of the model's kind
    ROWS[:, :63],
    ROWS.reshape(2, 8, 8),
    ROWS[0],
    np.zeros((0, 64), np.float32),
    np.full((2, 64), np.nan, np.float32),
    np.full((2, 64), 1e39),  # overflows float32 to infinity
    np.asfortranarray(ROWS),
    np.array(1.0, np.float32),
]


@pytest.mark.parametrize("array", NPY_FAST_PATH_ARRAYS, ids=lambda array: f"{array.dtype.str}{list(array.shape)}")
def test_the_npy_fast_path_accepts_exactly_what_the_general_path_accepts(array: np.ndarray) -> None:
    # GIVEN an .npy body, valid or not
    parsed = codecs.decode_body(npy(array), media_types.NPY)
    # WHEN the fast path and the general validation both read it
    fast = fast_paths.fast_npy(parsed, DIGITS, max_batch_rows=10_000)
    try:
        general = input_checks.validate_inputs(
            codecs.payload_to_arrays(parsed, media_types.NPY, DIGITS), DIGITS, max_batch_rows=10_000
        )
    except InvalidInput:
        # THEN a body the general path refuses is never taken by the fast one
        assert fast is None
        return
    # THEN whatever the fast path takes is the same array, of the same dtype
    if fast is not None:
        np.testing.assert_array_equal(fast["input"], general["input"])
        assert fast["input"].dtype == general["input"].dtype


def test_the_npy_fast_path_keeps_the_row_limit() -> None:
    parsed = codecs.decode_body(npy(ROWS), media_types.NPY)
    assert fast_paths.fast_npy(parsed, DIGITS, max_batch_rows=1) is None


def test_an_npy_body_of_the_model_dtype_is_read_in_place() -> None:
    # GIVEN a float32 body, the model's dtype; WHEN it is decoded
    body = npy(ROWS)
    array = fast_paths.fast_npy(codecs.decode_body(body, media_types.NPY), DIGITS, max_batch_rows=10_000)
    # THEN the input is a view of the body's bytes, not a copy
    assert array is not None
    assert np.shares_memory(array["input"], np.frombuffer(body, dtype=np.uint8))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.int64),
        np.arange(32 * 10, dtype=np.float32).reshape(32, 10),
        np.arange(24, dtype=">f8").reshape(2, 3, 4),
        np.array([True, False, True]),
        np.arange(12, dtype=np.float16).reshape(3, 4)[:, ::2],  # strided: copied to C order
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.array(2.5),
        np.zeros((0, 10), np.uint16),
    ],
    ids=lambda array: f"{array.dtype.str}{list(array.shape)}",
)
def test_encoded_npy_round_trips_dtype_shape_and_values(array: np.ndarray) -> None:
    # WHEN an array is written as .npy
    body = codecs.encode_npy([array])
    # THEN np.load reads back the same dtype, shape and values
    loaded = np.load(io.BytesIO(body), allow_pickle=False)
    assert loaded.dtype == array.dtype
    assert loaded.shape == array.shape
    np.testing.assert_array_equal(loaded, array)
    # AND for a C-ordered array the bytes are exactly np.save's
    if array.flags.c_contiguous:
        assert body == npy(array)


def test_a_multi_output_npy_answer_carries_every_numeric_output_predictions_first() -> None:
    # GIVEN a model answer with predictions, probabilities and an extra numeric output
    outputs = {"label": np.array([3, 1]), "probabilities": np.eye(10, dtype=np.float32)[[3, 1]]}
    fields = answers.default_response(DIGITS, outputs) | {"outputs": {"embedding": np.ones((2, 4), np.float16)}}
    # WHEN it is written as .npy
    stream = io.BytesIO(answers.encode_response(fields, media_types.NPY).body)
    # THEN successive np.load calls read the predictions, then the probabilities, then the extra output
    np.testing.assert_array_equal(np.load(stream), [3, 1])
    probabilities = np.load(stream)
    assert probabilities.dtype == np.float32
    np.testing.assert_array_equal(probabilities, outputs["probabilities"])
    np.testing.assert_array_equal(np.load(stream), np.ones((2, 4), np.float16))
    assert stream.read() == b""


def test_string_predictions_are_not_acceptable_as_npy() -> None:
    fields = {"model": "m", "version": "1", "predictions": np.array(["cat", "dog"], dtype=object)}
    with pytest.raises(NotAcceptable) as caught:
        answers.encode_response(fields, media_types.NPY)
    assert caught.value.field == "Accept"


def test_labels_are_named_only_for_json() -> None:
    outputs = {"label": np.array([3, 1]), "probabilities": np.eye(10, dtype=np.float32)[[3, 1]]}
    assert "labels" in answers.default_response(DIGITS, outputs)
    assert "labels" not in answers.default_response(DIGITS, outputs, with_labels=False)


def test_a_header_read_before_still_has_its_body_size_checked() -> None:
    # GIVEN a header already read (and remembered) from a valid body
    body = npy(ROWS)
    np.testing.assert_array_equal(decode(body, media_types.NPY), ROWS)
    # WHEN the same header comes with too few or too many bytes
    # THEN each body is refused as not matching its header
    assert invalid(body[:-4], media_types.NPY).field == "body"
    assert invalid(body + b"\0" * 4, media_types.NPY).field == "body"
    # AND the valid body still reads
    np.testing.assert_array_equal(decode(body, media_types.NPY), ROWS)


# ------------------------------------------------------------------------------------------ body fast paths


@pytest.fixture(scope="module")
def digits_plan() -> fast_paths.RowsPlan:
    plan = fast_paths.rows_plan(DIGITS, 256)
    assert plan is not None
    return plan


def test_a_plain_json_body_is_read_straight_into_the_model_dtype(digits_plan: fast_paths.RowsPlan) -> None:
    # GIVEN the common body, with ints, floats and whitespace
    body = b' {"instances": [' + b",".join([orjson.dumps(ROWS[0].tolist())] * 2) + b"]}\n"
    # WHEN the body fast path reads it
    fast = fast_paths.fast_json_body(body, digits_plan)
    # THEN it takes it, in float32, with the values the general path reads
    assert fast is not None
    assert fast["input"].dtype == np.float32
    np.testing.assert_array_equal(fast["input"], decode(body))


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": [[' + b"1," * 63 + b"true]]}",  # numpy would read a boolean as 1.0
        b'{"instances": [[' + b"1," * 63 + b'"7"]]}',  # and a string as 7.0
        b'{"instances": [[' + b"1," * 63 + b"null]]}",  # and null as NaN
        b'{"instances": [[' + b"1," * 63 + b"1e39]]}",  # past float32's range
        b'{"instancEs": [[' + b"1," * 63 + b"1]]}",  # the same bytes once exponents are deleted
        b'{"instances": [[' + b"1," * 63 + b"1]], }",
        b'{"instances": [' + b"1," * 63 + b"1]}",
        b'{"instances": [[' + b"1," * 62 + b"1]]}",
    ],
)
def test_the_json_body_fast_path_leaves_every_other_body_to_the_general_path(
    digits_plan: fast_paths.RowsPlan, body: bytes
) -> None:
    assert fast_paths.fast_json_body(body, digits_plan) is None


def test_an_npy_body_of_the_model_dtype_is_taken_in_place_by_the_body_fast_path(
    digits_plan: fast_paths.RowsPlan,
) -> None:
    body = npy(ROWS)
    fast = fast_paths.fast_npy_body(body, digits_plan)
    assert fast is not None
    np.testing.assert_array_equal(fast["input"], ROWS)
    assert np.shares_memory(fast["input"], np.frombuffer(body, dtype=np.uint8))
    # the same header again (now remembered) with a body one value short is left to the general path
    assert fast_paths.fast_npy_body(body[:-4], digits_plan) is None


@pytest.mark.parametrize(
    "array",
    [ROWS.astype(np.float64), ROWS.astype(">f4"), np.asfortranarray(ROWS), ROWS[:, :63].copy(),
     np.full((2, 64), np.nan, np.float32), np.full((2, 64), np.inf, np.float32), np.zeros((0, 64), np.float32)],
    ids=["float64", "big-endian", "fortran", "63 columns", "nan", "inf", "no rows"],
)  # fmt: skip
def test_the_npy_body_fast_path_leaves_every_other_body_to_the_general_path(
    digits_plan: fast_paths.RowsPlan, array: np.ndarray
) -> None:
    assert fast_paths.fast_npy_body(npy(array), digits_plan) is None


MULTI_OUTPUT = DIGITS.__class__(
    **{
        **{field: getattr(DIGITS, field) for field in DIGITS.__struct_fields__},
        "outputs": (*DIGITS.outputs, TensorSpec("embedding", "float16", (None, 4))),
    }
)


@pytest.mark.parametrize(
    ("manifest", "outputs"),
    [
        (DIGITS, {"label": np.array([3, 1]), "probabilities": np.eye(10, dtype=np.float32)[[3, 1]]}),
        (DIGITS, {"label": np.array([3]), "probabilities": np.array([[0.5] * 10], ">f8")}),
        (DIGITS, {"label": np.array([3, 1]), "probabilities": np.array(["a", "b"], dtype=object)}),
        (
            MULTI_OUTPUT,
            {"label": np.array([2]), "probabilities": np.ones((1, 10), np.float32), "embedding": np.ones((1, 4), "f2")},
        ),
        (
            MULTI_OUTPUT,
            {"label": np.array([2]), "probabilities": np.ones((1, 10), np.float32), "predictions": np.ones((1, 4))},
        ),
        (DIGITS, {"label": np.asfortranarray(np.ones((2, 3), np.int64)), "probabilities": np.ones((2, 10))}),
    ],
    ids=["digits", "big-endian probabilities", "string probabilities", "extra output", "clashing name", "fortran"],
)
def test_the_npy_answer_is_the_general_answer_written_as_npy(
    manifest: Manifest, outputs: dict[str, np.ndarray]
) -> None:
    general = answers.encode_response(answers.default_response(manifest, outputs, with_labels=False), media_types.NPY)
    assert answers.npy_answer(manifest, outputs) == general.body


def test_string_predictions_are_not_acceptable_as_an_npy_answer() -> None:
    with pytest.raises(NotAcceptable):
        answers.npy_answer(DIGITS, {"label": np.array(["cat"], dtype=object), "probabilities": np.ones((1, 10))})


def test_the_npy_body_fast_path_of_a_one_dimensional_input_leaves_a_scalar_to_the_general_path() -> None:
    # GIVEN a model whose one input is a plain vector of rows (shape [N]), and a 0-d .npy body
    vector = Manifest(
        **{field: getattr(DIGITS, field) for field in DIGITS.__struct_fields__}
        | {"inputs": (TensorSpec("input", "float32", (None,)),)}
    )
    plan = fast_paths.rows_plan(vector, 256)
    assert plan is not None
    # WHEN the body fast path reads it THEN it leaves it to the general path (which names the problem)
    assert fast_paths.fast_npy_body(npy(np.array(1.0, np.float32)), plan) is None
    # and a vector of rows is taken
    taken = fast_paths.fast_npy_body(npy(np.arange(3, dtype=np.float32)), plan)
    assert taken is not None
    np.testing.assert_array_equal(taken["input"], [0.0, 1.0, 2.0])


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("application/json; charset=utf-8", media_types.JSON),
        ("text/csv; header=present", media_types.CSV_HEADER),
        ("multipart/form-data; boundary=----x", "multipart/form-data; boundary=----x"),
        ("IMAGE/JPEG", "image/jpeg"),
        ("text/plain;charset=latin-1", "text/plain; charset=latin-1"),
        ("application/octet-stream;", "application/octet-stream"),
    ],
)
def test_a_type_no_codec_reads_keeps_its_parameters_for_the_hook(header: str, expected: str) -> None:
    # GIVEN a request's Content-Type, WHEN it is read, THEN a codec's type is bare, any other keeps its parameters
    assert media_types.request_type_of(header) == expected


def test_a_model_without_a_hook_refuses_a_raw_body_naming_the_bare_type() -> None:
    # GIVEN the digits model (no preprocess hook), WHEN a form is sent to it, THEN the codecs' 415, without the boundary
    model = ServedModel.load(ARTIFACTS / "digits" / "1", ServingSettings())
    with pytest.raises(UnsupportedMediaType) as caught:
        model.infer(b"--x\r\n", "multipart/form-data; boundary=x", None)
    assert (caught.value.value, caught.value.allowed) == (
        "multipart/form-data",
        "application/json, text/csv, application/x-npy",
    )
