"""The codecs' property tests (tests/unit/test_codec_properties.py) extended to a model with a column of every type
(float32, float64 with NaN, int64, int32, uint8, bool, string: tests/tabular_fixtures.py `every_type_package`),
fed random text per column in every codec that carries columns (issue 37, finding 5):
- JSON's by-name forms (each value a JSON string, or the text itself where it is a JSON number or literal:
  5,000-digit integers included), CSV with a header, CSV by column order: each body decodes to arrays of the
  columns' dtypes, or is refused with a 4xx `ServingError`; nothing else escapes;
- the batch job's decoders (JSON Lines, CSV with a header, Parquet columns of text): every row is scored or is
  an error row, and nothing escapes to stop the run;
- `.npy` headers whose dimensions are runs of up to 6,000 digits: decoded or a 4xx;
- the same bodies through the HTTP app: 200 or 4xx, never a 5xx.
Run with SERVESTACK_HYPOTHESIS_PROFILE=long for thousands of examples.
"""

from __future__ import annotations

import asyncio
import csv
import io
import re
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servestack.adapters.app import ServingApp
from servestack.inference import codecs, media_types
from servestack.inference.manifest import numpy_dtype_of
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular.decode import decode_piece
from servestack.inference.tabular.rows import Records, split_lines
from tests.tabular_fixtures import EVERY_TYPE, every_type_package
from tests.unit.test_codec_properties import attempt, npy_header

NAMES = list(EVERY_TYPE)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    return every_type_package(tmp_path_factory.mktemp("every-type"))


@pytest.fixture(scope="module")
def app(model: ServedModel) -> ServingApp:
    settings = ServingSettings(
        model_dir=model.package_dir.parent.parent, default_model="every-type", warmup=False, reject_pause_ms=0
    )
    repository = ModelRepository(settings)
    repository.load_all()
    return ServingApp(repository)


# ------------------------------------------------------------------------------------------ text per column

digit_runs = st.builds(
    lambda sign, count, tail: sign + "9" * count + tail,
    st.sampled_from(["", "-", "+", "0"]),
    st.one_of(st.integers(0, 25), st.integers(4000, 6000)),
    st.one_of(st.just(""), st.sampled_from([".5", "e3", "e99999", "x", ".", "e", "0", " "])),
)
words = st.sampled_from(
    ["", "nan", "NaN", "inf", "-Infinity", "true", "false", "True", "1", "0", "null", "NA", "1_0", "١٢", "0x10",
     " 1 ", "1e", "+-1", "9223372036854775808", "-9223372036854775809", "256", "-1", "1.0", "2147483648", "1e309"]
)  # fmt: skip
number_like = st.from_regex(r"[+-]?\d{0,30}(\.\d{0,5})?([eE][+-]?\d{0,4})?", fullmatch=True)
texts = st.one_of(digit_runs, words, number_like, st.text(max_size=20))
# Each column mostly holds what it takes, so that the random text of one column is reached (a body is refused
# at its first bad column), and sometimes any text at all.
_TAKEN = {
    "f32": st.floats(-1e6, 1e6, width=32).map(repr),
    "f64": st.one_of(st.floats(allow_infinity=False).map(repr), st.just("NaN")),
    "i64": st.integers(-(2**63), 2**63 - 1).map(str),
    "i32": st.integers(-(2**31), 2**31 - 1).map(str),
    "u8": st.integers(0, 255).map(str),
    "flag": st.sampled_from(["true", "false", "1", "0"]),
    "name": st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8),
}
table_rows = st.lists(
    st.fixed_dictionaries({name: st.one_of(taken, taken, taken, texts) for name, taken in _TAKEN.items()}),
    min_size=1,
    max_size=4,
)
_JSON_TOKEN = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity")


def json_value(text: str, raw: bool) -> bytes:
    """The text as a JSON string, or (`raw`, where it is one) as the JSON number or literal it spells."""
    return text.encode() if raw and _JSON_TOKEN.fullmatch(text) else orjson.dumps(text)


@st.composite
def json_bodies(draw: st.DrawFn) -> bytes:
    rows = draw(table_rows)
    names = draw(st.permutations(NAMES))
    raw = draw(st.booleans())

    def value(row: dict[str, str], name: str) -> bytes:
        return json_value(row[name], raw)

    form = draw(st.sampled_from(["dataframe_split", "dataframe_records", "instances", "inputs"]))
    quoted = [orjson.dumps(name) for name in names]
    if form == "dataframe_split":
        data = b",".join(b"[" + b",".join(value(row, name) for name in names) + b"]" for row in rows)
        return b'{"dataframe_split": {"columns": [' + b",".join(quoted) + b'], "data": [' + data + b"]}}"
    if form == "inputs":
        by_column = (
            q + b": [" + b",".join(value(row, name) for row in rows) + b"]"
            for q, name in zip(quoted, names, strict=True)
        )
        return b'{"inputs": {' + b",".join(by_column) + b"}}"
    records = b",".join(
        b"{" + b",".join(q + b":" + value(row, name) for q, name in zip(quoted, names, strict=True)) + b"}"
        for row in rows
    )
    return b'{"' + form.encode() + b'": [' + records + b"]}"


def csv_text(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


@st.composite
def csv_bodies(draw: st.DrawFn) -> tuple[bytes, str]:
    rows = draw(table_rows)
    kind = draw(st.sampled_from(["header=present", "header found", "column order"]))
    names = draw(st.permutations(NAMES)) if kind != "column order" else NAMES
    cells = [[row[name] for name in names] for row in rows]
    if kind == "column order":
        return csv_text(cells), media_types.CSV
    return csv_text([list(names), *cells]), media_types.CSV_HEADER if kind == "header=present" else media_types.CSV


def check_decoded(model: ServedModel, body: bytes, content_type: str) -> None:
    """Arrays of each column's dtype, one row per row; or a 4xx ServingError; anything else fails the test."""
    arrays, error = attempt(lambda: model.decode(body, content_type))
    if error is not None:
        assert 400 <= error.status_code < 500, error.to_dict()
        assert len(orjson.dumps(error.to_dict())) < 4096
        return
    assert arrays is not None
    assert sorted(arrays) == sorted(NAMES)
    rows = {array.shape[0] for array in arrays.values()}
    assert len(rows) == 1
    for column in model.columns:
        array = arrays[column.name]
        assert array.shape[1:] == (1,)
        expected = np.dtype(object) if column.dtype == "string" else numpy_dtype_of(column.dtype)
        assert array.dtype == expected, column


@given(body=json_bodies())
def test_random_text_in_every_column_of_json_decodes_or_is_a_4xx(model: ServedModel, body: bytes) -> None:
    check_decoded(model, body, media_types.JSON)


@given(case=csv_bodies())
def test_random_text_in_every_column_of_csv_decodes_or_is_a_4xx(model: ServedModel, case: tuple[bytes, str]) -> None:
    check_decoded(model, *case)


# ------------------------------------------------------------------------------------------ the batch decoders


def check_rows_accounted(model: ServedModel, piece: Any, rows: int) -> None:
    decoded = decode_piece(model, piece)  # raises nothing: a bad row is an error row
    assert len(decoded.good) + len(decoded.bad) == rows
    assert sorted([*decoded.good.tolist(), *(row for row, _ in decoded.bad)]) == list(range(rows))
    for _, error in decoded.bad:
        assert 400 <= error.status_code < 500, error.to_dict()


@given(rows=table_rows, raw=st.booleans())
def test_random_text_in_json_lines_is_scored_or_an_error_row(
    model: ServedModel, rows: list[dict[str, str]], raw: bool
) -> None:
    lines = [
        b"{" + b",".join(orjson.dumps(name) + b":" + json_value(row[name], raw) for name in NAMES) + b"}"
        for row in rows
    ]
    piece = split_lines("in/a.jsonl", media_types.JSON, b"\n".join(lines) + b"\n", 1, file_start=True)
    check_rows_accounted(model, piece, len(rows))


@given(rows=table_rows)
def test_random_text_in_csv_lines_is_scored_or_an_error_row(model: ServedModel, rows: list[dict[str, str]]) -> None:
    data = csv_text([NAMES, *([row[name] for name in NAMES] for row in rows)])
    piece = split_lines("in/a.csv", media_types.CSV, data, 1, file_start=True)
    assert piece.header == tuple(NAMES)
    check_rows_accounted(model, piece, len(piece))


@given(rows=table_rows)
def test_random_text_in_parquet_columns_is_scored_or_an_error_row(
    model: ServedModel, rows: list[dict[str, str]]
) -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({name: [row[name] for row in rows] for name in NAMES}), sink)
    (batch,) = pq.ParquetFile(io.BytesIO(sink.getvalue()), read_dictionary=["name"]).iter_batches()
    piece = Records("in/a.parquet", batch, np.arange(1, len(rows) + 1, dtype=np.int64))
    check_rows_accounted(model, piece, len(rows))


# ------------------------------------------------------------------------------------------ .npy headers

long_dimensions = st.one_of(digit_runs, st.integers(0, 10**6).map(str))


@given(dims=st.lists(long_dimensions, min_size=1, max_size=3), data=st.binary(max_size=64))
def test_an_npy_header_of_long_digit_runs_decodes_or_is_a_4xx(model: ServedModel, dims: list[str], data: bytes) -> None:
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + ", ".join(dims) + ",), }"
    body = npy_header(header) + data
    for call in (lambda: codecs.decode_body(body, media_types.NPY), lambda: model.decode(body, media_types.NPY)):
        _, error = attempt(call)
        assert error is None or 400 <= error.status_code < 500, error.to_dict()


# ------------------------------------------------------------------------------------------ through the app


async def post(app: ServingApp, body: bytes, content_type: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # raise_app_exceptions: an escaped exception fails the test
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        return await client.post("/invocations", content=body, headers={"content-type": content_type})


@given(
    case=st.one_of(json_bodies().map(lambda body: (body, media_types.JSON)), csv_bodies()),
    npy_dims=st.lists(long_dimensions, min_size=1, max_size=2),
)
def test_random_text_in_any_column_is_a_200_or_a_4xx_through_the_app(
    app: ServingApp, case: tuple[bytes, str], npy_dims: list[str]
) -> None:
    npy = npy_header("{'descr': '<i8', 'fortran_order': False, 'shape': (" + ", ".join(npy_dims) + ",), }")
    for body, content_type in (case, (npy, media_types.NPY)):
        response = asyncio.run(post(app, body, content_type))
        assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
