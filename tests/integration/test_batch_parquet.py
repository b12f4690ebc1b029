"""Batch mode with Parquet on a real S3 endpoint: Parquet input (column per value, or a list column per model
input), Parquet output parts, and a resumed Parquet run that is byte-identical to an uninterrupted one."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.datasets import load_breast_cancer

from servestack.adapters.batch import BatchSettings, run_batch
from servestack.inference.errors import InvalidInput
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular import Progress
from servestack.inference.tabular.parquet_reading import parquet_module
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket
from tests.integration.test_batch_job import DiesStoringPart, Interrupted

pytestmark = pytest.mark.localstack

ROWS = load_breast_cancer().data.astype(np.float32)[:40]


def parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def outputs(aws: Aws, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = aws.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {
        o["Key"].removeprefix(prefix): aws.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed
    }


def core_predictions(rows: np.ndarray) -> dict[str, Any]:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    model = repository.get("breast-cancer")
    return model.respond(model.predict({"input": rows}))


def settings(bucket: str, input_prefix: str, output: str, **extra: Any) -> BatchSettings:
    return BatchSettings(
        deployment="t", bucket=bucket, input_prefix=input_prefix, output_prefix=output, model="breast-cancer", **extra
    )


def test_parquet_input_with_a_column_per_value_is_scored_and_a_null_is_an_error_row(aws: Aws, unique: str) -> None:
    # GIVEN a Parquet file of 30 float columns (one per feature), row 7 holding a null
    ensure_bucket(aws.s3, unique)
    columns = {f"f{i}": pa.array(ROWS[:, i].astype(np.float64)) for i in range(ROWS.shape[1])}
    values = ROWS[:, 3].astype(np.float64).tolist()
    values[6] = None
    columns["f3"] = pa.array(values, type=pa.float64())
    aws.s3.put_object(Bucket=unique, Key="pq/a.parquet", Body=parquet(pa.table(columns)))
    # WHEN the job runs in chunks of 16 rows
    manifest = run_batch(settings(unique, "pq/", "out/", chunk_rows=16))
    files = outputs(aws, unique, "out/")
    # THEN every row but the null one is predicted, as the core predicts it, with its row number as the line
    assert manifest["rows"] == {"total": 40, "succeeded": 39, "failed": 1}
    scored = [json.loads(line) for part in manifest["parts"] for line in files[part["key"]].splitlines()]
    good = np.delete(np.arange(40), 6)
    expected = core_predictions(ROWS[good])
    assert [r["line"] for r in scored] == (good + 1).tolist()
    assert [r["prediction"] for r in scored] == expected["predictions"].tolist()
    assert [r["label"] for r in scored] == expected["labels"]
    # AND the null row is in the error file under its file and row number, naming the column
    (error,) = [json.loads(line) for line in files["errors.jsonl"].splitlines()]
    assert (error["file"], error["line"]) == ("pq/a.parquet", 7)
    assert error["error"]["type"] == "InvalidInput"
    assert "null" in error["error"]["message"]


def test_parquet_input_with_a_list_column_named_for_the_input_matches_json_lines(aws: Aws, unique: str) -> None:
    # GIVEN the same rows as a Parquet list column named for the model's input, and as JSON Lines
    ensure_bucket(aws.s3, unique)
    table = pa.table({"input": pa.array(ROWS.tolist(), type=pa.list_(pa.float32()))})
    aws.s3.put_object(Bucket=unique, Key="lists/a.parquet", Body=parquet(table))
    jsonl = "\n".join(json.dumps(row.tolist()) for row in ROWS) + "\n"
    aws.s3.put_object(Bucket=unique, Key="lines/a.jsonl", Body=jsonl.encode())
    # WHEN both are scored
    from_parquet = run_batch(settings(unique, "lists/", "out-pq/", chunk_rows=12))
    from_lines = run_batch(settings(unique, "lines/", "out-jl/", chunk_rows=12))

    # THEN the predictions are the same, row for row
    def predicted(prefix: str, manifest: dict[str, Any]) -> list[tuple[int, Any, Any]]:
        files = outputs(aws, unique, prefix)
        rows = [json.loads(line) for part in manifest["parts"] for line in files[part["key"]].splitlines()]
        return [(r["line"], r["prediction"], r["label"]) for r in rows]

    assert from_parquet["rows"] == {"total": 40, "succeeded": 40, "failed": 0}
    assert predicted("out-pq/", from_parquet) == predicted("out-jl/", from_lines)


def seed_lines(aws: Aws, bucket: str) -> None:
    """JSONL with one malformed line, plus a CSV: 40 good rows, 1 bad."""
    lines = [json.dumps(row.tolist()) for row in ROWS[:25]]
    lines.insert(3, "[1.0, 2.0")
    csv = "\n".join(",".join(str(v) for v in row) for row in ROWS[25:])
    ensure_bucket(aws.s3, bucket)
    aws.s3.put_object(Bucket=bucket, Key="in/a.jsonl", Body="\n".join(lines) + "\n")
    aws.s3.put_object(Bucket=bucket, Key="in/b.csv", Body=csv + "\n")


def test_parquet_output_parts_hold_file_line_and_the_predictions(aws: Aws, unique: str) -> None:
    # GIVEN JSON Lines and CSV input with one bad row
    seed_lines(aws, unique)
    # WHEN the job writes Parquet parts
    manifest = run_batch(settings(unique, "in/", "out/", chunk_rows=16, output_format="parquet"))
    files = outputs(aws, unique, "out/")
    # THEN each part is a Parquet file whose sha256 the manifest holds
    assert manifest["output_format"] == "parquet"
    assert [part["key"] for part in manifest["parts"]] == [f"parts/part-{i:05d}.parquet" for i in range(3)]
    for part in manifest["parts"]:
        assert hashlib.sha256(files[part["key"]]).hexdigest() == part["sha256"]
    table = pa.concat_tables([pq.read_table(pa.BufferReader(files[p["key"]])) for p in manifest["parts"]])
    # AND its columns are file, line and the response fields, with the core's predictions row for row
    assert table.column_names == ["file", "line", "prediction", "probabilities", "label"]
    expected = core_predictions(ROWS)
    assert table.column("prediction").to_pylist() == expected["predictions"].tolist()
    assert np.array_equal(np.array(table.column("probabilities").to_pylist()), expected["probabilities"])
    assert table.column("label").to_pylist() == expected["labels"]
    places = list(zip(table.column("file").to_pylist(), table.column("line").to_pylist(), strict=True))
    assert places[:4] == [("in/a.jsonl", 1), ("in/a.jsonl", 2), ("in/a.jsonl", 3), ("in/a.jsonl", 5)]
    assert places[-1] == ("in/b.csv", 15)
    # AND the bad row is in the JSON Lines error file, as with JSON Lines parts
    (error,) = [json.loads(line) for line in files["errors.jsonl"].splitlines()]
    assert (error["file"], error["line"]) == ("in/a.jsonl", 4)


def test_an_interrupted_parquet_run_resumes_to_byte_identical_output(aws: Aws, unique: str) -> None:
    # GIVEN an uninterrupted Parquet-output run, and another into a second prefix that dies storing its third part
    seed_lines(aws, unique)
    whole = run_batch(settings(unique, "in/", "whole/", chunk_rows=8, output_format="parquet"))
    with pytest.raises(Interrupted):
        run_batch(
            settings(unique, "in/", "resumed/", chunk_rows=8, output_format="parquet"),
            store=DiesStoringPart(unique, 2),
        )
    assert "manifest.json" not in outputs(aws, unique, "resumed/")
    # WHEN it is run again
    seen: list[Progress] = []
    run_batch(settings(unique, "in/", "resumed/", chunk_rows=8, output_format="parquet"), on_progress=seen.append)
    # THEN it reused the stored parts, scored the missing one again, and its output is byte-identical to the
    # uninterrupted run
    assert 2 <= seen[-1].parts_skipped < len(whole["parts"])
    assert outputs(aws, unique, "resumed/") == outputs(aws, unique, "whole/")


def test_without_pyarrow_parquet_is_refused_naming_the_engines_that_carry_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a runtime without pyarrow (the Lambda bundle leaves it out)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    # WHEN Parquet is needed / THEN the refusal names the engine field and the engines that carry pyarrow
    with pytest.raises(InvalidInput) as refused:
        parquet_module()
    body = refused.value.to_dict()
    assert body["field"] == "engine"
    assert "fargate" in str(body["allowed"])
