"""Property tests of every codec (JSON, CSV, .npy) through the model's decode path, with hostile bodies.

Each run proves, over hundreds of generated bodies (thousands with SERVESTACK_HYPOTHESIS_PROFILE=long):
- a body either decodes to arrays that fit the model's signature, or is refused with a 4xx `ServingError`;
- nothing else escapes (no RecursionError, TypeError, ValueError, MemoryError...);
- decoding one body raises the process's peak resident memory by a bounded amount, however large a shape
  the body claims (measured around each decode: Hypothesis's own memory is not the code under test's).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays as numpy_arrays

from servestack.inference import answers, codecs, fast_paths, input_checks, media_types
from servestack.inference.errors import ServingError
from servestack.inference.manifest import Manifest, TensorSpec, read_manifest
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS
from tests.memory import peak_rss_growth

# What decoding one generated body (at most a few KiB) may add to the peak resident size. A lying header asks
# for far more: the smallest such lie generated below claims 10**9 rows of 64 values (hundreds of GiB).
MEMORY_BOUND_BYTES = 32 * 1024 * 1024
ROW = 64
T = TypeVar("T")


@pytest.fixture(scope="module")
def model() -> ServedModel:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    return repository.get("digits")


def attempt(call: Callable[[], T]) -> tuple[T | None, ServingError | None]:
    """The call's result, or the `ServingError` it raised; any other exception escapes and fails the test."""
    try:
        return call(), None
    except ServingError as error:
        return None, error


def check(model: ServedModel, body: bytes, content_type: str) -> None:
    """The property: fitting arrays, or a 4xx ServingError; anything else fails the test; memory bounded."""
    with peak_rss_growth() as growth:
        arrays, error = attempt(lambda: model.decode(body, content_type))
    assert growth.bytes < MEMORY_BOUND_BYTES, f"decoding raised the peak resident size by {growth.bytes} bytes"
    if error is not None:
        described = error.to_dict()
        assert 400 <= error.status_code < 500, described
        assert described["type"]
        assert described["message"]
        assert len(orjson.dumps(described)) < 4096
        return
    assert arrays is not None
    (array,) = arrays.values()
    assert array.dtype == np.float32
    assert array.ndim == 2
    assert array.shape[1] == ROW
    assert 1 <= array.shape[0] <= model.max_batch_rows
    assert np.isfinite(array).all()


# ------------------------------------------------------------------------------------------ JSON

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=60,
)
numbers = st.one_of(st.integers(-(10**6), 10**6), st.floats(allow_nan=True, allow_infinity=True, width=64))
row_like = st.one_of(
    st.lists(numbers, min_size=ROW, max_size=ROW),
    st.lists(numbers, min_size=ROW - 2, max_size=ROW + 2),
    st.lists(st.one_of(numbers, scalars), min_size=ROW, max_size=ROW),
)
documents = st.one_of(
    json_values,
    st.fixed_dictionaries({"instances": st.lists(row_like, max_size=5)}),
    st.fixed_dictionaries({"instances": json_values}),
    st.fixed_dictionaries({"inputs": st.dictionaries(st.sampled_from(["input", "x", ""]), json_values, max_size=2)}),
    st.fixed_dictionaries({"instances": st.lists(row_like, max_size=3), "inputs": json_values}),
)


def nested(depth: int, core: str) -> str:
    return "[" * depth + core + "]" * depth


@st.composite
def json_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["document", "truncated", "deep", "junk", "binary"]))
    if kind == "binary":
        return draw(st.binary(max_size=512))
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        core = draw(st.sampled_from(["1", "NaN", "", "true", '"x"', "1e999"]))
        wrapped = draw(st.booleans())
        text = nested(depth, core)
        return (f'{{"instances": {text}}}' if wrapped else text).encode()
    text = json.dumps(draw(documents), allow_nan=True)
    if kind == "truncated":
        text = text[: draw(st.integers(0, len(text)))]
    if kind == "junk":
        text = (
            draw(st.sampled_from(["\ufeff", " ", "x", "]", "{"])) + text + draw(st.sampled_from(["", "]", ",", "\x00"]))
        )
    return text.encode("utf-8", errors="surrogatepass")


@given(body=json_bodies())
def test_any_json_body_decodes_or_is_a_4xx(model: ServedModel, body: bytes) -> None:
    check(model, body, media_types.JSON)


# ------------------------------------------------------------------------------------------ CSV

cells = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["1_0", "true", "١٢", "0x10", "1e", " 1 ", '"2.5"', "'3'", "", "+-1", "1e999", "nan"]),
    st.text(alphabet=st.sampled_from(list("0123456789.,-+e\"'\x1c\u2028\r\n\t ;")), max_size=10),
)
line_ends = st.sampled_from(["\n", "\r\n", "\r", "\x1c", "\u2028", "\n\n"])


@st.composite
def csv_bodies(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=512))
    rows = draw(st.lists(st.lists(cells, min_size=ROW - 1, max_size=ROW + 1), max_size=4))
    end = draw(line_ends)
    text = end.join(",".join(row) for row in rows)
    if draw(st.booleans()):
        text = "\ufeff" + text
    return text.encode("utf-8", errors="surrogatepass")


@given(body=csv_bodies())
def test_any_csv_body_decodes_or_is_a_4xx(model: ServedModel, body: bytes) -> None:
    check(model, body, media_types.CSV)


def test_a_valid_csv_body_with_a_bom_quotes_and_crlf_decodes() -> None:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    rows = np.arange(2 * ROW, dtype=np.float32).reshape(2, ROW) % 16
    text = "\ufeff" + "\r\n".join(",".join(f'"{v:g}"' for v in row) for row in rows) + "\r\n"
    decoded = repository.get("digits").decode(text.encode(), media_types.CSV)["input"]
    np.testing.assert_array_equal(decoded, rows)


# ------------------------------------------------------------------------------------------ .npy

descriptors = st.one_of(
    st.sampled_from(["<f4", ">f4", "<f8", "|b1", "<i8", "|u1", "<f2", "<i3", "<f99", "<u0", "|O", "S10", "<U5"]),
    st.sampled_from(["<c8", "<f16", "|V8", "<M8[s]", "O", "", "f4", "=f4"]),
    st.text(max_size=8),
)
shapes = st.one_of(
    st.tuples(st.integers(0, 8), st.just(ROW)),
    st.lists(st.integers(-3, 10**15), max_size=4).map(tuple),
    st.tuples(st.integers(10**9, 10**15), st.just(ROW)),
)


def npy_header(header: dict[str, Any] | str, version: int = 1) -> bytes:
    text = (header if isinstance(header, str) else repr(header)).encode("latin-1", errors="replace")
    prefix = 10 if version == 1 else 12
    text += b" " * ((64 - (prefix + len(text) + 1) % 64) % 64) + b"\n"
    size = len(text).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + text


@st.composite
def npy_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["header", "header", "raw-header", "real", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=512).map(lambda data: b"\x93NUMPY" + data))
    if kind == "real":
        array: np.ndarray = draw(
            st.sampled_from(
                [
                    np.zeros((2, ROW), np.float32),
                    np.ones((1, ROW), np.float64),
                    np.zeros((3, ROW), np.int8),
                    np.zeros((2, ROW), bool),
                    np.full((1, ROW), np.inf),
                    np.asfortranarray(np.ones((3, ROW), ">f4")),
                    np.zeros((ROW,), np.float32),
                    np.zeros((2, 8, 8), np.float32),
                ]
            )
        )
        buffer = io.BytesIO()
        np.save(buffer, array)
        data = buffer.getvalue()
        cut = draw(st.integers(0, len(data)))
        return data if draw(st.booleans()) else data[:cut]
    data = draw(st.binary(max_size=600))
    if kind == "raw-header":
        return npy_header(draw(st.text(max_size=80))) + data
    header = {
        "descr": draw(descriptors),
        "fortran_order": draw(st.one_of(st.booleans(), st.integers(0, 2))),
        "shape": draw(shapes),
    }
    return npy_header(header, draw(st.sampled_from([1, 2]))) + data


@given(body=npy_bodies())
def test_any_npy_body_decodes_or_is_a_4xx(model: ServedModel, body: bytes) -> None:
    check(model, body, media_types.NPY)


# ------------------------------------------------------------------------------------------ headers


@given(accept=st.text(max_size=60))
def test_accept_negotiation_never_raises_outside_the_hierarchy(accept: str) -> None:
    chosen, error = attempt(lambda: media_types.negotiate(accept))
    assert chosen in media_types.WRITABLE_TYPES if error is None else error.status_code == 406


@given(encoding=st.text(max_size=30), body=st.binary(max_size=256))
def test_content_encoding_never_raises_outside_the_hierarchy(encoding: str, body: bytes) -> None:
    decoded, error = attempt(lambda: media_types.decode_content(body, encoding, 1024))
    assert len(decoded or b"") <= 1024 if error is None else error.status_code in (400, 413, 415)


# ------------------------------------------------------------------------------------------ the body fast paths
# `ServedModel.decode` tries `fast_json_body` / `fast_npy_body` first. Whatever they take, the general path
# (parse, then `decode_payload`) must take too, with the same values in the same dtype; whatever they leave,
# the general path decides. Plain numeric bodies are generated on purpose, so the fast paths do take many.


def general_decode(model: ServedModel, body: bytes, content_type: str) -> codecs.Arrays:
    """`ServedModel.decode` without the body-level fast paths."""
    if content_type != media_types.NPY:
        fast_paths.check_value_count(body, model.max_values)
    payload = codecs.decode_body(body, content_type)
    booleans = content_type == media_types.JSON and fast_paths.may_hold_booleans(body)
    return model.decode_payload(payload, content_type, may_hold_booleans=booleans)


def assert_same_as_general(model: ServedModel, body: bytes, content_type: str, fast: codecs.Arrays | None) -> None:
    general, error = attempt(lambda: general_decode(model, body, content_type))
    if fast is None:
        return
    assert error is None, f"the fast path took a body the general path refuses: {error}"
    assert general is not None
    assert fast.keys() == general.keys()
    for name, array in fast.items():
        assert array.dtype == general[name].dtype
        np.testing.assert_array_equal(array, general[name])


ordinary_numbers = st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6))
# One value of a body, now and then, from the edges: past float32's range, integers past 2**53, -0.0...
extreme_numbers = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False, allow_infinity=False), st.just(-0.0)
)


@st.composite
def plain_values(draw: st.DrawFn, extremes: st.SearchStrategy[Any]) -> tuple[int, int, list[Any]]:
    """(rows, row width, values): mostly the model's width, ordinary values, sometimes one extreme."""
    rows = draw(st.integers(1, 4))
    width = draw(st.sampled_from([ROW, ROW, ROW, ROW - 1, ROW + 1]))
    values = draw(st.lists(ordinary_numbers, min_size=rows * width, max_size=rows * width))
    if draw(st.integers(0, 2)) == 0:
        values[draw(st.integers(0, len(values) - 1))] = draw(extremes)
    return rows, width, values


@st.composite
def plain_json_bodies(draw: st.DrawFn) -> bytes:
    rows, width, values = draw(plain_values(extreme_numbers))
    document = {"instances": [values[start : start + width] for start in range(0, rows * width, width)]}
    spacing = draw(st.sampled_from([None, (",", ":"), (", ", ": ")]))
    text = orjson.dumps(document) if spacing is None else json.dumps(document, separators=spacing).encode()
    return text if draw(st.booleans()) else b"\n " + text + b" \r\n"


@given(body=st.one_of(plain_json_bodies(), json_bodies()))
def test_the_json_body_fast_path_takes_only_what_the_general_path_takes(model: ServedModel, body: bytes) -> None:
    assert model.rows_plan is not None
    assert_same_as_general(model, body, media_types.JSON, fast_paths.fast_json_body(body, model.rows_plan))


@st.composite
def plain_npy_bodies(draw: st.DrawFn) -> bytes:
    rows, width, values = draw(plain_values(st.floats(width=32)))  # NaN and infinities too
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(values, dtype=np.float32).reshape(rows, width))
    data = buffer.getvalue()
    return data if draw(st.integers(0, 5)) else data[: draw(st.integers(0, len(data)))]


@given(body=st.one_of(plain_npy_bodies(), npy_bodies()))
def test_the_npy_body_fast_path_takes_only_what_the_general_path_takes(model: ServedModel, body: bytes) -> None:
    assert model.rows_plan is not None
    assert_same_as_general(model, body, media_types.NPY, fast_paths.fast_npy_body(body, model.rows_plan))


# ------------------------------------------------------------------------------------------ the answer fast paths
# `ServedModel.answer` writes the usual JSON and `.npy` answers through `answers.AnswerPlan`. Whatever it writes must
# be byte for byte what the general path (`encode_response(default_response(...))`) writes; what it leaves (None),
# the general path writes.

DIGITS_MANIFEST = read_manifest(ARTIFACTS / "digits" / "1")
DIGITS_FIELDS = {field: getattr(DIGITS_MANIFEST, field) for field in DIGITS_MANIFEST.__struct_fields__}
ANSWER_MANIFESTS = {
    "labels and probabilities": DIGITS_MANIFEST,
    "integer labels": Manifest(**DIGITS_FIELDS | {"labels": (0, 1, 2, 3, 5, 8, 13, 21, 34, 55)}),
    "no labels": Manifest(**DIGITS_FIELDS | {"labels": None}),
    "no probabilities": Manifest(
        **DIGITS_FIELDS | {"probability_output": None, "outputs": (DIGITS_MANIFEST.outputs[0],)}
    ),
    # A string-labelled classifier (tests/pipeline_model.py): its prediction a string tensor, which onnxruntime
    # gives as `str` objects only (`AnswerPlan.text_predictions`), so its outputs are drawn as "class names".
    "string labels": Manifest(
        **DIGITS_FIELDS
        | {
            "labels": tuple(f"class {i}" for i in range(10)),
            "outputs": (TensorSpec("label", "string", (None,)), DIGITS_MANIFEST.outputs[1]),
        }
    ),
}


@st.composite
def answer_outputs(draw: st.DrawFn) -> tuple[Manifest, dict[str, Any]]:
    manifest = ANSWER_MANIFESTS[draw(st.sampled_from(sorted(ANSWER_MANIFESTS)))]
    rows = draw(st.integers(0, 4))
    kinds = ["int64", "int32", "uint8", "bool", "float32", "str", "object", "class names", "2-d", "2-d float32", "list"]
    kind = draw(st.sampled_from(kinds)) if manifest.outputs[0].dtype != "string" else "class names"
    ids = draw(st.lists(st.integers(-2, 12), min_size=rows, max_size=rows))
    predictions: Any
    if kind == "str":
        predictions = np.array([str(i) for i in ids])
    elif kind == "object":
        predictions = np.array([i if i % 2 else float(i) for i in ids] or [], dtype=object)
    elif kind == "class names":  # what onnxruntime gives for a string-labelled classifier
        predictions = np.array([f"class {i}" for i in ids] or [], dtype=object)
    elif kind == "2-d":  # a single target as [N, 1]: flat in every answer
        predictions = np.array(ids, dtype=np.int64).reshape(rows, 1)
    elif kind == "2-d float32":
        predictions = (np.array(ids, dtype=np.float32) / 3).reshape(rows, 1)
    elif kind == "list":
        predictions = ids
    else:
        predictions = np.abs(np.array(ids)).astype(kind) if kind in ("uint8", "bool") else np.array(ids, dtype=kind)
    outputs: dict[str, Any] = {"label": predictions}
    if manifest.probability_output is not None:
        probability_dtype = draw(st.sampled_from(["float32", "float64", ">f8"]))
        outputs["probabilities"] = np.ones((rows, 10), dtype=probability_dtype) / draw(st.integers(1, 7))
    if draw(st.integers(0, 9)) == 0:
        outputs["extra"] = np.zeros(rows)
    return manifest, outputs


@given(case=answer_outputs())
def test_the_answer_fast_paths_write_exactly_what_the_general_path_writes(case: tuple[Manifest, Any]) -> None:
    manifest, outputs = case
    plan = answers.answer_plan(manifest)
    assert plan is not None
    fast_json = answers.json_answer(plan, outputs)
    if fast_json is not None:
        assert fast_json == answers.encode_response(answers.default_response(manifest, outputs), media_types.JSON).body
    fast_npy = answers.planned_npy_answer(plan, outputs)
    if fast_npy is not None:
        assert fast_npy == answers.npy_answer(manifest, outputs)
    ordinary = type(outputs["label"]) is np.ndarray and outputs["label"].dtype == np.int64 and "extra" not in outputs
    if ordinary and all(0 <= i < 10 for i in outputs["label"].reshape(-1).tolist()):
        assert fast_json is not None  # the usual answer does take the fast path
        if outputs["label"].ndim == 1 and outputs.get("probabilities", np.ones(1, np.float32)).dtype == np.float32:
            assert fast_npy is not None


def test_a_non_contiguous_output_with_a_remembered_shape_takes_the_general_npy_path() -> None:
    # GIVEN a plan that has written an .npy answer of these shapes from contiguous outputs
    plan = answers.answer_plan(DIGITS_MANIFEST)
    assert plan is not None
    labels = np.array([1, 2], dtype=np.int64)
    assert answers.planned_npy_answer(plan, {"label": labels, "probabilities": np.ones((2, 10), np.float32)})
    # WHEN the same shapes come as a strided view
    strided: dict[str, np.ndarray] = {
        "label": labels,
        "probabilities": np.arange(40, dtype=np.float32).reshape(2, 20)[:, ::2],
    }
    # THEN the fast path declines, and the general path writes the values in order
    assert answers.planned_npy_answer(plan, strided) is None
    body = io.BytesIO(answers.npy_answer(DIGITS_MANIFEST, strided))
    np.testing.assert_array_equal(np.load(body), labels)
    np.testing.assert_array_equal(np.load(body), strided["probabilities"])


# ------------------------------------------------------------------------------------------ every .npy dtype
# The .npy fast paths (`fast_npy_body`, then `fast_npy` on the parsed array) against the general path for every
# dtype an .npy body may carry, in both byte orders, with any values (NaN, infinities, the dtype's extremes):
# each body decodes or is a 4xx (`check`), and what a fast path takes the general path takes too, the same.
# Model inputs of every float width are covered through manifests that differ from digits' only in the dtype.

ACCEPTED_NPY_DTYPES = sorted(codecs.NPY_DTYPES)
FLOAT_INPUT_MANIFESTS = {
    dtype: Manifest(**DIGITS_FIELDS | {"inputs": (msgspec.structs.replace(DIGITS_MANIFEST.inputs[0], dtype=dtype),)})
    for dtype in ("float32", "float64")
}


@st.composite
def npy_arrays_of_every_dtype(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(ACCEPTED_NPY_DTYPES)))
    rows = draw(st.integers(1, 3))
    width = draw(st.sampled_from([ROW, ROW, ROW, ROW - 1]))
    return draw(numpy_arrays(dtype, (rows, width), elements={"allow_subnormal": False} if dtype.kind == "f" else None))


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_every_accepted_npy_dtype_is_generated_in_both_byte_orders() -> None:
    orders: dict[str, set[str]] = {descr[1:]: set() for descr in ACCEPTED_NPY_DTYPES}
    for descr in ACCEPTED_NPY_DTYPES:
        orders[descr[1:]].add(descr[0])
    assert {"f2", "f4", "f8", "i2", "i8", "u4"} <= orders.keys()
    assert all(found == {"<", ">"} for kind, found in orders.items() if kind[1] != "1")


@given(array=npy_arrays_of_every_dtype())
def test_an_npy_body_of_any_accepted_dtype_decodes_or_is_a_4xx(model: ServedModel, array: np.ndarray) -> None:
    body = npy_bytes(array)
    check(model, body, media_types.NPY)
    assert model.rows_plan is not None
    assert_same_as_general(model, body, media_types.NPY, fast_paths.fast_npy_body(body, model.rows_plan))


@pytest.mark.parametrize("target", sorted(FLOAT_INPUT_MANIFESTS))
@given(array=npy_arrays_of_every_dtype())
def test_the_npy_array_fast_path_takes_only_what_validation_takes_for_any_dtype(target: str, array: np.ndarray) -> None:
    manifest = FLOAT_INPUT_MANIFESTS[target]
    parsed = codecs.decode_body(npy_bytes(array), media_types.NPY)
    fast, _ = attempt(lambda: fast_paths.fast_npy(parsed, manifest, max_batch_rows=100))
    general, error = attempt(
        lambda: input_checks.validate_inputs(
            codecs.payload_to_arrays(parsed, media_types.NPY, manifest), manifest, max_batch_rows=100
        )
    )
    if error is not None:
        assert 400 <= error.status_code < 500
        assert fast is None
        return
    assert general is not None
    assert general["input"].dtype == np.dtype(target)
    if fast is not None:
        assert fast["input"].dtype == general["input"].dtype
        np.testing.assert_array_equal(fast["input"], general["input"])


# ------------------------------------------------------------------------------------------ the by-name forms
# A tabular model's rows can come as `dataframe_split`, `dataframe_records`, `instances` of row objects,
# `inputs` by column, CSV with a header, and (for the models that always took them) `instances` of lists and
# `inputs` of [N, 1] lists: every form of the same rows decodes to the same arrays and gets the same answer
# bytes as the existing tensor form. Two real models: one [N, 3] input named a, b, c (its tensor form is
# `instances`, served by the fast paths), and a scikit-learn ColumnTransformer pipeline with one [N, 1] input
# per column and a string column (its tensor form is `inputs` of [N, 1] lists).

number_cells = st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e30, 1e30, allow_nan=False, width=64))


@pytest.fixture(scope="module")
def summing(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    from tests.tabular_fixtures import summing_package

    return summing_package(tmp_path_factory.mktemp("summing"))


@pytest.fixture(scope="module")
def flowers() -> ServedModel:
    from tests.pipeline_model import pipeline_model

    built = pipeline_model()
    repository = ModelRepository(ServingSettings(model_dir=built.root, default_model="flowers", warmup=False))
    repository.load_all()
    return repository.get("flowers")


def forms(names: list[str], rows: list[list[Any]], order: list[int]) -> dict[str, tuple[bytes, str]]:
    """The same rows in every by-name form; `order`: a permutation of the columns, for the forms that may
    carry them in any order."""
    shuffled = [names[i] for i in order]
    records = [{name: row[names.index(name)] for name in shuffled} for row in rows]
    by_column = {name: [row[names.index(name)] for row in rows] for name in shuffled}
    header = ",".join(shuffled) + "\n"
    csv_rows = "\n".join(",".join(_cell(row[names.index(name)]) for name in shuffled) for row in rows)
    return {
        "dataframe_split": (
            orjson.dumps(
                {
                    "dataframe_split": {
                        "columns": shuffled,
                        "data": [[r[names.index(n)] for n in shuffled] for r in rows],
                    }
                }
            ),
            media_types.JSON,
        ),
        "dataframe_records": (orjson.dumps({"dataframe_records": records}), media_types.JSON),
        "instances of objects": (orjson.dumps({"instances": records}), media_types.JSON),
        "inputs by column": (orjson.dumps({"inputs": by_column}), media_types.JSON),
        "csv with a header": ((header + csv_rows).encode(), media_types.CSV),
        "csv, header=present": ((header + csv_rows).encode(), media_types.CSV_HEADER),
    }


def _cell(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def assert_forms_agree(model: ServedModel, tensor_body: bytes, named: dict[str, tuple[bytes, str]]) -> None:
    expected = model.decode(tensor_body, media_types.JSON)
    expected_answer = model.answer(model.predict(expected), media_types.JSON).body
    for form, (body, content_type) in named.items():
        arrays = model.decode(body, content_type)
        assert arrays.keys() == expected.keys(), form
        for name, array in arrays.items():
            assert array.dtype == expected[name].dtype, (form, name)
            assert array.shape == expected[name].shape, (form, name)
            assert array.tolist() == expected[name].tolist(), (form, name)
        assert model.answer(model.predict(arrays), media_types.JSON).body == expected_answer, form


@given(
    rows=st.lists(st.lists(number_cells, min_size=3, max_size=3), min_size=1, max_size=6),
    order=st.permutations([0, 1, 2]),
)
def test_every_by_name_form_equals_the_instances_of_a_named_tensor(
    summing: ServedModel, rows: list[list[Any]], order: list[int]
) -> None:
    assert_forms_agree(summing, orjson.dumps({"instances": rows}), forms(["a", "b", "c"], rows, order))


@given(
    rows=st.lists(
        st.tuples(*[number_cells] * 4, st.sampled_from(["north", "south", "east"])).map(list), min_size=1, max_size=6
    ),
    order=st.permutations(range(5)),
)
def test_every_by_name_form_equals_the_inputs_of_a_pipeline(
    flowers: ServedModel, rows: list[list[Any]], order: list[int]
) -> None:
    from tests.pipeline_model import COLUMNS

    names = list(COLUMNS)
    tensors = {"inputs": {name: [[row[i]] for row in rows] for i, name in enumerate(names)}}
    named = forms(names, rows, list(order))
    named["instances of rows"] = (orjson.dumps({"instances": rows}), media_types.JSON)  # several inputs: by position
    assert_forms_agree(flowers, orjson.dumps(tensors), named)
