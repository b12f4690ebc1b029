"""Request values that cost more than their size, or escaped as something other than the caller's 4xx: column
names checked in one pass, number cells matched in linear time, integers of thousands of digits, and the
error bodies and header values that name them.

The time bounds are seconds where the code under test takes milliseconds: the quadratic versions took 5 to 50
seconds on the same bodies (issue 37), so a shared, busy machine cannot make these flaky.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from servestack.adapters.body import PAST_ANY_LIMIT, declared_size, too_large
from servestack.inference import codecs, media_types
from servestack.inference.columns import arrays_from_columns, first_repeated
from servestack.inference.errors import InvalidInput, ServingError, short_repr
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from tests.tabular_fixtures import counting_package, summing_package

FIVE_THOUSAND_DIGITS = "9" * 5000
QUICK_SEC = 2.0  # what a linear check of these bodies may take on a loaded machine; the quadratic ones took 5-50 s


@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return counting_package(tmp_path_factory.mktemp("counting"))


@pytest.fixture(scope="module")
def digits() -> ServedModel:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    return repository.get("digits")


def refused_quickly(call: Callable[[], Any]) -> dict[str, Any]:
    """The 4xx error body `call` raises, which it must raise within QUICK_SEC."""
    started = time.perf_counter()
    with pytest.raises(ServingError) as caught:
        call()
    assert time.perf_counter() - started < QUICK_SEC
    assert 400 <= caught.value.status_code < 500, caught.value.to_dict()
    described: dict[str, Any] = orjson.loads(orjson.dumps(caught.value.to_dict()))  # the JSON a client reads
    return described


# ------------------------------------------------------------------------------------------ column names


def test_the_first_repeated_name_is_found_in_one_pass() -> None:
    assert first_repeated(["a", "b", "c"]) is None
    assert first_repeated(["a", "b", "b", "a"]) == "b"
    assert first_repeated([f"c{i}" for i in range(100_000)] + ["c99999"]) == "c99999"


@pytest.mark.parametrize("names", [15_000, 30_000])
def test_a_dataframe_split_of_thousands_of_names_with_the_last_repeated_is_refused_quickly(
    counting: ServedModel, names: int
) -> None:
    # GIVEN a dataframe_split naming `names` columns, the last of them twice (the slowest place to find it)
    columns = [f"c{i}" for i in range(names)] + [f"c{names - 1}"]
    body = orjson.dumps({"dataframe_split": {"columns": columns, "data": [[1]]}})
    # WHEN it is decoded THEN it is refused within seconds: a 400 naming the repeated column, or (30,000 names
    # are as many values as 10,000 rows of this model's 3 columns) the 413 of the value-count bound
    error = refused_quickly(lambda: counting.decode(body, media_types.JSON))
    assert (error["field"], error["value"]) in (
        ("dataframe_split.columns", f"c{names - 1}"),
        ("body", "> 30000 values"),
    )


@pytest.mark.parametrize("names", [15_000, 30_000])
def test_a_csv_header_of_thousands_of_names_with_the_last_repeated_is_refused_quickly(
    counting: ServedModel, names: int
) -> None:
    header = ",".join([f"c{i}" for i in range(names)] + [f"c{names - 1}"])
    error = refused_quickly(lambda: counting.decode(f"{header}\n1\n".encode(), media_types.CSV_HEADER))
    assert (error["field"], error["value"]) in (("csv header", f"c{names - 1}"), ("body", "> 30000 values"))


def test_thousands_of_unknown_columns_are_refused_quickly(counting: ServedModel) -> None:
    # GIVEN columns by name, 50,000 of them the model does not take
    columns: dict[str, Any] = {f"c{i}": [1] for i in range(50_000)} | {"a": [1], "b": [2], "c": [3]}
    # WHEN converted THEN the first unknown one (in order) is named, within seconds
    error = refused_quickly(lambda: arrays_from_columns(counting.manifest, columns, field="inputs"))
    assert error["value"] == "c0"


# ------------------------------------------------------------------------------------------ number cells


@pytest.mark.parametrize("tail", ["x", "e", ".5x", "e+"])
def test_a_cell_of_40000_digits_that_is_no_number_is_refused_quickly(digits: ServedModel, tail: str) -> None:
    # GIVEN a CSV row for the digits model whose first cell is 40,000 digits and then no number (the pattern
    # `\d+\.?\d*` backtracked over every split of the digits: 50 s)
    row = ",".join(["1" * 40_000 + tail] + ["1"] * 63)
    # WHEN decoded THEN it is a 400 naming the cell, within seconds
    error = refused_quickly(lambda: digits.decode(row.encode(), media_types.CSV))
    assert error["field"] == "csv line 1 column 1"


def test_a_cell_of_40000_digits_in_a_named_float_column_is_refused_quickly(tmp_path: Path) -> None:
    summing = summing_package(tmp_path)  # float32 columns a, b, c
    body = f"a,b,c\n1,2,{'1' * 40_000}.5x\n".encode()
    assert refused_quickly(lambda: summing.decode(body, media_types.CSV_HEADER))["field"] == "csv.c[0]"


# ------------------------------------------------------------------------------------------ over-long integers


@pytest.mark.parametrize(
    "cell",
    [FIVE_THOUSAND_DIGITS, "-" + FIVE_THOUSAND_DIGITS, "+" + "0" * 10 + FIVE_THOUSAND_DIGITS, "9" * 20, "9" * 19],
)
def test_an_integer_cell_past_int64_is_a_400_naming_it(counting: ServedModel, cell: str) -> None:
    # GIVEN a CSV row whose integer cell is past int64 (5,000 digits: int() raises ValueError; 19 or 20 digits:
    # past the range)
    body = f"a,b,c\n1,2,3\n4,5,{cell}\n".encode()
    # WHEN decoded THEN it is a 400 naming the cell and saying what fits
    error = refused_quickly(lambda: counting.decode(body, media_types.CSV_HEADER))
    assert error["field"] == "csv.c[1]"
    assert "at most 19 digits" in error["allowed"]
    assert len(orjson.dumps(error)) < 2048  # the value is shown cut short


def test_the_longest_integer_cells_that_fit_int64_decode(counting: ServedModel) -> None:
    body = f"a,b,c\n9223372036854775807,-9223372036854775808,+{'0' * 5000}1\n-{'0' * 5000},0,-0\n".encode()
    (array,) = counting.decode(body, media_types.CSV_HEADER).values()
    assert array.tolist() == [[2**63 - 1, -(2**63), 1], [0, 0, 0]]


@pytest.mark.parametrize(
    "document",
    [
        {"dataframe_split": {"columns": ["a", "b", "c"], "data": [[1, 2, "<N>"]]}},
        {"dataframe_records": [{"a": 1, "b": 2, "c": "<N>"}]},
        {"inputs": {"a": [1], "b": [2], "c": ["<N>"]}},
        {"instances": [[1, 2, "<N>"]]},
    ],
)
@pytest.mark.parametrize("with_nan", [False, True], ids=["orjson", "json-with-NaN"])
def test_a_5000_digit_json_integer_is_a_400_in_every_form(
    counting: ServedModel, document: dict[str, Any], with_nan: bool
) -> None:
    # GIVEN the integer written into the JSON text (NaN elsewhere makes the codec fall back to Python's parser,
    # which refuses integers past 4,300 digits with a ValueError)
    text = orjson.dumps(document).replace(b'"<N>"', FIVE_THOUSAND_DIGITS.encode())
    if with_nan:
        text = text.replace(b"[1", b"[NaN", 1).replace(b'"a":1', b'"a":NaN', 1)
    # WHEN decoded THEN it is a 400
    refused_quickly(lambda: counting.decode(text, media_types.JSON))


def test_an_npy_header_with_a_5000_digit_dimension_is_a_400(digits: ServedModel) -> None:
    # GIVEN the header np.save writes, with a first dimension of 5,000 digits (a 1.0 header holds up to 64 KiB)
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + FIVE_THOUSAND_DIGITS + ", 64), }"
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    body = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + b"\x00" * 256
    # WHEN decoded (and parsed as the general codec does) THEN it is a 400 about the shape
    for call in (lambda: digits.decode(body, media_types.NPY), lambda: codecs.decode_body(body, media_types.NPY)):
        assert "shape" in refused_quickly(call)["message"]


def test_a_conversion_error_no_check_names_is_still_the_callers_400(counting: ServedModel) -> None:
    # GIVEN a preprocess-free model and a payload whose conversion raises a ValueError inside numpy (a column
    # that is a generator: neither list nor array, and no check expects it)
    class Exploding(list[int]):
        def __iter__(self) -> Any:
            raise ValueError("no values here")

    columns: dict[str, Any] = {"a": Exploding([1]), "b": [2], "c": [3]}
    # WHEN converted THEN it is InvalidInput naming the form's field, not a ValueError
    with pytest.raises(InvalidInput) as caught:
        arrays_from_columns(counting.manifest, columns, field="inputs")
    assert caught.value.field == "inputs"
    assert "ValueError" in caught.value.message


# ------------------------------------------------------------------------------------------ what names the value


def test_a_huge_integer_is_described_without_being_written_out() -> None:
    huge = 10**5000
    assert short_repr(huge) == "<an integer of 16610 bits>"
    described = InvalidInput("too big", field="x", value=huge).to_dict()
    assert described["value"] == "<an integer of 16610 bits>"
    assert short_repr(2**100) == repr(2**100)


@pytest.mark.parametrize("value", [FIVE_THOUSAND_DIGITS, FIVE_THOUSAND_DIGITS.encode(), "9" * 19])
def test_a_content_length_of_thousands_of_digits_is_past_any_limit(value: str | bytes) -> None:
    assert declared_size(value) == PAST_ANY_LIMIT
    assert too_large(6 * 1024 * 1024, PAST_ANY_LIMIT).to_dict()["value"] == f">= {PAST_ANY_LIMIT}"


def test_a_content_length_with_leading_zeros_reads_as_its_number() -> None:
    assert declared_size("0" * 40 + "123") == 123
    assert declared_size("0" * 5000 + "123") == 123
    assert declared_size(b"0" * 5000) == 0
    assert declared_size(b"999999999999999999") == 999_999_999_999_999_999


def test_the_asgi_app_answers_a_5000_digit_content_length_with_413(tmp_path: Path) -> None:
    import asyncio

    from servestack.adapters.app import ServingApp

    repository = ModelRepository(ServingSettings(warmup=False, reject_pause_ms=0))
    repository.load_all()
    app = ServingApp(repository)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/invocations",
        "headers": [(b"content-type", b"application/json"), (b"content-length", FIVE_THOUSAND_DIGITS.encode())],
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413
    assert orjson.loads(sent[1]["body"])["error"]["value"] == f">= {PAST_ANY_LIMIT}"
