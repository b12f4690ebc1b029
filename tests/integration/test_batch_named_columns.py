"""Batch with named columns on a real S3 endpoint, with a real user's model: a scikit-learn ColumnTransformer
pipeline (scaled numeric columns, a one-hot string column, string labels) converted with skl2onnx
(tests/pipeline_model.py). Parquet with string columns, JSON Lines of records and CSV with a header map onto the
model's columns by name; each output row carries the id column and named prediction and probability columns;
Parquet output is typed; predictions joined back by id equal the estimator's own."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servestack.adapters.batch import BatchSettings, run_batch
from servestack.inference.errors import InvalidInput
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket
from tests.pipeline_model import COLUMNS, SPECIES, PipelineModel, frame, pipeline_model

pytestmark = pytest.mark.localstack
ROWS = 12


@pytest.fixture
def flowers(monkeypatch: pytest.MonkeyPatch) -> PipelineModel:
    model = pipeline_model()
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(model.root))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "flowers")
    return model


def ids() -> list[int]:
    return [1000 + 7 * row for row in range(ROWS)][::-1]  # not in row order, so a join is needed


def input_table(model: PipelineModel) -> pa.Table:
    """The rows with an id column first, the model's columns in another order, and a column it does not take."""
    table = frame(model.rows)
    columns = {"row_id": pa.array(ids(), pa.int64()), "note": pa.array([f"n{i}" for i in range(ROWS)])}
    columns |= {name: table.column(name) for name in reversed(COLUMNS)}
    return pa.table(columns)


def settings(bucket: str, prefix: str, **extra: Any) -> BatchSettings:
    return BatchSettings(
        deployment="t",
        bucket=bucket,
        input_prefix=f"in/{prefix}",
        output_prefix=f"out/{prefix}",
        model="flowers",
        **extra,
    )


def read(aws: Aws, bucket: str, key: str) -> bytes:
    return bytes(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def expected_by_id(model: PipelineModel) -> dict[int, tuple[str, np.ndarray]]:
    return {ident: (model.expected[row], model.probabilities[row]) for row, ident in enumerate(ids())}


def test_parquet_with_string_columns_and_an_id_gives_typed_parquet_joined_by_id(
    aws: Aws, unique: str, flowers: PipelineModel
) -> None:
    # GIVEN a Parquet file of the pipeline's rows: a string column, an id column, a column the model does not take
    ensure_bucket(aws.s3, unique)
    sink = io.BytesIO()
    pq.write_table(input_table(flowers), sink, row_group_size=5)
    aws.s3.put_object(Bucket=unique, Key="in/pq/rows.parquet", Body=sink.getvalue())
    # WHEN the job scores it into Parquet parts, with the id column
    manifest = run_batch(settings(unique, "pq/", id_column="row_id", output_format="parquet", chunk_rows=5))
    # THEN every row is scored, and the parts are typed: the id as in the input, the prediction a string,
    # a float32 column per class, and no label column repeating the prediction
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    table = pa.concat_tables(
        [pq.read_table(pa.BufferReader(read(aws, unique, f"out/pq/{part['key']}"))) for part in manifest["parts"]]
    )
    probability_columns = [f"proba_{label}" for label in SPECIES]
    assert table.column_names == ["file", "line", "row_id", "prediction", *probability_columns]
    schema = table.schema
    assert schema.field("row_id").type == pa.int64()
    assert schema.field("prediction").type == pa.string()
    assert all(schema.field(name).type == pa.float32() for name in probability_columns)
    # AND joined by id, the predictions are the estimator's, the probabilities within float32 tolerance
    expected = expected_by_id(flowers)
    found = table.to_pylist()
    assert sorted(row["row_id"] for row in found) == sorted(expected)
    for row in found:
        label, probabilities = expected[row["row_id"]]
        assert row["prediction"] == label
        np.testing.assert_allclose([row[name] for name in probability_columns], probabilities, atol=1e-5)


def test_json_lines_of_records_and_csv_with_a_header_map_columns_the_same_way(
    aws: Aws, unique: str, flowers: PipelineModel
) -> None:
    # GIVEN the same rows as JSON Lines of records (keys in any order) and as CSV whose header names the columns
    ensure_bucket(aws.s3, unique)
    records = input_table(flowers).to_pylist()
    lines = [json.dumps(dict(reversed(list(record.items())))) for record in records]
    aws.s3.put_object(Bucket=unique, Key="in/jl/rows.jsonl", Body="\n".join(lines).encode())
    header = list(records[0])
    csv = [",".join(header)] + [",".join(str(record[name]) for name in header) for record in records]
    aws.s3.put_object(Bucket=unique, Key="in/csv/rows.csv", Body="\n".join(csv).encode())
    # WHEN the job scores each, with the id column
    expected = expected_by_id(flowers)
    for prefix in ("jl/", "csv/"):
        manifest = run_batch(settings(unique, prefix, id_column="row_id"))
        assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}, prefix
        rows = [
            json.loads(line)
            for part in manifest["parts"]
            for line in read(aws, unique, f"out/{prefix}{part['key']}").splitlines()
        ]
        # THEN each row carries its id (CSV cells are text) and the estimator's prediction, and no label
        for row in rows:
            assert list(row)[:4] == ["file", "line", "row_id", "prediction"]
            assert "label" not in row
            label, probabilities = expected[int(row["row_id"])]
            assert row["prediction"] == label
            np.testing.assert_allclose([row[f"proba_{name}"] for name in SPECIES], probabilities, atol=1e-5)
        assert {type(row["row_id"]) for row in rows} == ({int} if prefix == "jl/" else {str})


def test_a_row_missing_a_column_or_its_id_is_an_error_row_naming_it(
    aws: Aws, unique: str, flowers: PipelineModel
) -> None:
    # GIVEN records where line 2 lacks the `site` column and line 3 has a null id
    ensure_bucket(aws.s3, unique)
    records = input_table(flowers).to_pylist()[:4]
    del records[1]["site"]
    records[2]["row_id"] = None
    aws.s3.put_object(Bucket=unique, Key="in/bad/rows.jsonl", Body="\n".join(map(json.dumps, records)).encode())
    # WHEN the job runs / THEN those two are error rows that name the column, and the other two are scored
    manifest = run_batch(settings(unique, "bad/", id_column="row_id"))
    assert manifest["rows"] == {"total": 4, "succeeded": 2, "failed": 2}
    errors = [json.loads(line) for line in read(aws, unique, "out/bad/errors.jsonl").splitlines()]
    assert [(error["line"], error["error"]["value"]) for error in errors] == [(2, "site"), (3, None)]
    assert "sepal_length" in errors[0]["error"]["allowed"]
    assert "row_id" in errors[1]["error"]["message"]


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_a_row_of_a_category_the_model_never_saw_is_one_error_row(
    aws: Aws, unique: str, flowers: PipelineModel, output_format: str
) -> None:
    # GIVEN six records in one chunk, where line 3 holds a site the one-hot encoder never saw: onnxruntime fails
    # the chunk's whole batch for it
    ensure_bucket(aws.s3, unique)
    records = input_table(flowers).to_pylist()[:6]
    records[2]["site"] = "atlantis"
    aws.s3.put_object(Bucket=unique, Key="in/cat/rows.jsonl", Body="\n".join(map(json.dumps, records)).encode())
    # WHEN the job runs
    manifest = run_batch(settings(unique, "cat/", id_column="row_id", output_format=output_format, chunk_rows=6))
    # THEN that row alone is an error row naming the string column, and the chunk's other rows are scored as alone
    assert manifest["rows"] == {"total": 6, "succeeded": 5, "failed": 1}
    errors = [json.loads(line) for line in read(aws, unique, "out/cat/errors.jsonl").splitlines()]
    assert [(error["line"], error["error"]["type"]) for error in errors] == [(3, "InvalidInput")]
    assert (errors[0]["error"]["field"], errors[0]["error"]["value"]) == ("site", "atlantis")
    keys = [f"out/cat/{part['key']}" for part in manifest["parts"]]
    if output_format == "parquet":
        scored = pa.concat_tables([pq.read_table(pa.BufferReader(read(aws, unique, key))) for key in keys]).to_pylist()
    else:
        scored = [json.loads(line) for key in keys for line in read(aws, unique, key).splitlines()]
    assert [row["line"] for row in scored] == [1, 2, 4, 5, 6]
    expected = expected_by_id(flowers)
    for row in scored:
        label, probabilities = expected[int(row["row_id"])]
        assert row["prediction"] == label
        np.testing.assert_allclose([row[f"proba_{name}"] for name in SPECIES], probabilities, atol=1e-5)


def test_a_strict_job_stops_at_a_row_the_model_refuses_naming_where_it_is(
    aws: Aws, unique: str, flowers: PipelineModel
) -> None:
    ensure_bucket(aws.s3, unique)
    records = input_table(flowers).to_pylist()[:4]
    records[1]["site"] = "atlantis"
    aws.s3.put_object(Bucket=unique, Key="in/strict/rows.jsonl", Body="\n".join(map(json.dumps, records)).encode())
    with pytest.raises(InvalidInput) as raised:
        run_batch(settings(unique, "strict/", id_column="row_id", strict=True))
    assert raised.value.field == "in/strict/rows.jsonl:2"
    assert "column 'site' holds 'atlantis'" in raised.value.message
