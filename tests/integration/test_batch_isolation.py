"""One input must not cost a whole batch run, on a real S3 endpoint: a file that cannot be read is one error
record naming it and why, the other files are scored, and the manifest says what became of each file; a line
over `max_record_bytes` is an error row and its neighbours are scored; in Transform, a line holding only a byte
order mark at the start of a mini-batch does not stop the manifest step."""

from __future__ import annotations

import functools
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servestack.adapters.batch import BatchSettings, run_batch, transform_done
from servestack.inference import media_types
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular.transform import score_lines
from servestack.local.lambda_.runtime import LambdaContext
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket
from tests.integration.test_transform_manifest import event

pytestmark = pytest.mark.localstack


@functools.cache
def data_rows() -> np.ndarray:
    """24 rows of the breast-cancer data, loaded at first use: every worker collects this module."""
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer().data.astype(np.float32)[:24]


COLUMNS = [f"f{i}" for i in range(30)]


@pytest.fixture(scope="module")
def model() -> ServedModel:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    return repository.get("breast-cancer")


def parquet(table: pa.Table, **options: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def columns_table(rows: np.ndarray, names: list[str] = COLUMNS) -> pa.Table:
    return pa.Table.from_arrays([pa.array(rows[:, i]) for i in range(rows.shape[1])], names=names)


def settings(bucket: str, **extra: Any) -> BatchSettings:
    return BatchSettings(
        deployment="t", bucket=bucket, input_prefix="in/", output_prefix="out/", model="breast-cancer", **extra
    )


def read(aws: Aws, bucket: str, key: str) -> bytes:
    return bytes(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def scored(aws: Aws, bucket: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for part in manifest["parts"]
        for line in read(aws, bucket, f"out/{part['key']}").split(b"\n")
        if line
    ]


def errors(aws: Aws, bucket: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read(aws, bucket, "out/errors.jsonl").splitlines()]


def test_each_unreadable_file_is_one_error_record_and_the_other_files_are_scored(aws: Aws, unique: str) -> None:
    # GIVEN good JSON Lines and Parquet files among a truncated Parquet file, one whose middle is corrupt, one
    # with a column named twice, and a CSV file named .parquet
    ensure_bucket(aws.s3, unique)
    good_parquet = parquet(columns_table(data_rows()[8:16]))
    corrupt = bytearray(parquet(columns_table(data_rows()[:8]), compression="none"))
    corrupt[4 : len(corrupt) // 2] = b"\xff" * (len(corrupt) // 2 - 4)
    bad = {
        "in/b-truncated.parquet": good_parquet[: len(good_parquet) // 2],
        "in/c-corrupt.parquet": bytes(corrupt),
        "in/d-twice.parquet": parquet(columns_table(data_rows()[:4], ["f0", *COLUMNS[:29]])),
        "in/e-csv.parquet": b"\n".join(b",".join(str(v).encode() for v in row) for row in data_rows()[:4]) + b"\n",
    }
    good = {
        "in/a.jsonl": ("\n".join(json.dumps(row.tolist()) for row in data_rows()[:8]) + "\n").encode(),
        "in/f.parquet": good_parquet,
    }
    for key, body in (bad | good).items():
        aws.s3.put_object(Bucket=unique, Key=key, Body=body)
    # WHEN the job runs
    manifest = run_batch(settings(unique, chunk_rows=5))
    # THEN the manifest is written, with an outcome per file, and the good files' 16 rows are scored
    assert json.loads(read(aws, unique, "out/manifest.json")) == manifest
    outcomes = {entry["key"]: entry["outcome"] for entry in manifest["inputs"]}
    assert outcomes == dict.fromkeys(bad, "failed") | dict.fromkeys(good, "read")
    rows = scored(aws, unique, manifest)
    assert [(row["file"], row["line"]) for row in rows] == [("in/a.jsonl", i) for i in range(1, 9)] + [
        ("in/f.parquet", i) for i in range(1, 9)
    ]
    assert manifest["rows"] == {"total": 20, "succeeded": 16, "failed": 4}
    # AND each bad file is one error record, line 0, naming the file and why
    found = {error["file"]: error for error in errors(aws, unique)}
    assert set(found) == set(bad)
    for key, error in found.items():
        assert error["line"] == 0
        assert error["error"]["field"] == "file"
        assert key in error["error"]["message"]
    assert "named more than once" in found["in/d-twice.parquet"]["error"]["message"]
    assert "PAR1" in found["in/e-csv.parquet"]["error"]["message"]
    assert [entry["error"] for entry in manifest["inputs"] if entry["outcome"] == "failed"] == [
        found[key]["error"] for key in sorted(bad)
    ]


def test_a_parquet_file_with_too_many_columns_is_refused_from_its_footer(aws: Aws, unique: str) -> None:
    # GIVEN a one-row Parquet file of 12,000 columns (over the 10,000 limit) next to a good file
    ensure_bucket(aws.s3, unique)
    wide = pa.Table.from_arrays([pa.array([1.0], pa.float32())] * 12_000, names=[f"c{i}" for i in range(12_000)])
    aws.s3.put_object(Bucket=unique, Key="in/wide.parquet", Body=parquet(wide))
    aws.s3.put_object(Bucket=unique, Key="in/z.parquet", Body=parquet(columns_table(data_rows()[:3])))
    # WHEN the job runs / THEN the wide file is one error naming the column count, and the other is scored
    manifest = run_batch(settings(unique))
    (error,) = errors(aws, unique)
    assert (error["file"], error["line"], error["error"]["value"]) == ("in/wide.parquet", 0, 12_000)
    assert manifest["rows"] == {"total": 4, "succeeded": 3, "failed": 1}


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_line_over_max_record_bytes_is_an_error_row_and_its_neighbours_are_scored(
    aws: Aws, unique: str, suffix: str
) -> None:
    # GIVEN a file whose line 3 is 3 MB (longer than a block read from S3 only if the limit is small), whose
    # line 6 is 100 KB, both over a 64 KiB limit, among lines of rows
    ensure_bucket(aws.s3, unique)

    def line(row: np.ndarray) -> bytes:
        return json.dumps(row.tolist()).encode() if suffix == ".jsonl" else ",".join(map(str, row.tolist())).encode()

    huge = (b"[" + b"1.5," * 750_000 + b"1]") if suffix == ".jsonl" else b"1.5," * 750_000 + b"1"
    large = huge[: 100_000 - 1] + huge[-1:]
    lines = [
        line(data_rows()[0]),
        line(data_rows()[1]),
        huge,
        line(data_rows()[2]),
        line(data_rows()[3]),
        large,
        line(data_rows()[4]),
    ]
    aws.s3.put_object(Bucket=unique, Key=f"in/a{suffix}", Body=b"\n".join(lines) + b"\n")
    # WHEN the job runs with max_record_bytes 64 KiB
    manifest = run_batch(settings(unique, max_record_bytes=65_536))
    # THEN lines 3 and 6 are error rows saying the limit, and the five rows around them are scored
    assert manifest["rows"] == {"total": 7, "succeeded": 5, "failed": 2}
    assert [row["line"] for row in scored(aws, unique, manifest)] == [1, 2, 4, 5, 7]
    found = errors(aws, unique)
    assert [(error["line"], error["error"]["field"]) for error in found] == [(3, "line"), (6, "line")]
    assert all("65536" in error["error"]["message"] for error in found)
    assert found[0]["error"]["value"] == f"{len(huge)} bytes"


def test_a_line_of_only_a_byte_order_mark_at_the_start_of_a_mini_batch_still_gets_a_manifest(
    aws: Aws, unique: str, model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a transform job's input whose line 5 holds only a BOM, where MaxPayloadInMB cut a mini-batch
    ensure_bucket(aws.s3, unique)
    lines = [json.dumps(row.tolist()).encode() for row in data_rows()[:8]]
    body = b"\n".join([*lines[:4], b"\xef\xbb\xbf", *lines[4:]]) + b"\n"
    cut = len(b"\n".join(lines[:4])) + 1
    answers = score_lines(model, body[:cut], media_types.JSON) + score_lines(model, body[cut:], media_types.JSON)
    aws.s3.put_object(Bucket=unique, Key="in/a.jsonl", Body=body)
    aws.s3.put_object(Bucket=unique, Key="out/a.jsonl.out", Body=answers)
    for key, value in {"DEPLOYMENT": "t", "BUCKET": unique, "INPUT_PREFIX": "in/", "OUTPUT_PREFIX": "out/",
                       "MODEL": "breast-cancer", "INPUT_FORMAT": "jsonl"}.items():  # fmt: skip
        monkeypatch.setenv(f"SERVESTACK_BATCH_{key}", value)
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "breast-cancer")
    # WHEN the manifest step runs
    transform_done(event(), LambdaContext("done", 900, 2048))
    # THEN the manifest is written: the BOM line is blank, as it is at the start of a file, and 8 rows scored
    manifest = json.loads(read(aws, unique, "out/manifest.json"))
    assert manifest["rows"] == {"total": 8, "succeeded": 8, "failed": 0}
