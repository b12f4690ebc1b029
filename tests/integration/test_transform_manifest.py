"""The engine: transform manifest step on a real S3 endpoint: `servestack.adapters.batch.transform_done` on SageMaker's
job state change event pairs each `.out` answer line with its input line, gathers the error lines, writes the
manifest, and refuses a failed job or a job whose answers do not match its input."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from servestack.adapters.batch import transform_done
from servestack.inference import media_types
from servestack.inference.errors import InternalError
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular.transform import score_lines
from servestack.local.lambda_.runtime import LambdaContext
from tests.conftest import EVENTS
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket

pytestmark = pytest.mark.localstack

ROWS = load_breast_cancer().data.astype(np.float32)[:30]


def event(status: str = "Completed", **detail: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((EVENTS / "sageMakerTransformJobStateChange.json").read_text())
    raw["detail"] |= {"TransformJobStatus": status, **detail}
    return raw


def seed_job_output(aws: Aws, bucket: str) -> dict[str, bytes]:
    """Two input objects and the `.out` objects Transform writes for them (answers from the container's own
    scoring, score_lines), plus a README that Transform also sends through the container."""
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    model = repository.get("breast-cancer")
    lines = [json.dumps(row.tolist()) for row in ROWS]
    inputs = {
        "a.jsonl": ("\n".join(lines[:12]) + "\n").encode(),
        "b.jsonl": ("\n".join([*lines[12:15], "", "[1.0, 2.0", *lines[15:]]) + "\n").encode(),
    }
    ensure_bucket(aws.s3, bucket)
    for name, body in inputs.items():
        aws.s3.put_object(Bucket=bucket, Key=f"in/{name}", Body=body)
        # Two mini-batches per object, as MaxPayloadInMB would cut it; AssembleWith Line joins the answers.
        cut = body.index(b"\n", len(body) // 2) + 1
        answers = score_lines(model, body[:cut], media_types.JSON) + score_lines(model, body[cut:], media_types.JSON)
        aws.s3.put_object(Bucket=bucket, Key=f"out/{name}.out", Body=answers)
    aws.s3.put_object(Bucket=bucket, Key="in/README.txt", Body=b"not input")
    aws.s3.put_object(Bucket=bucket, Key="out/README.txt.out", Body=b'{"error": {}}\n')
    return inputs


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, unique: str) -> str:
    # What servestack/cdk/batch.py sets on the manifest function.
    for key, value in {
        "DEPLOYMENT": "scores",
        "BUCKET": unique,
        "INPUT_PREFIX": "in/",
        "OUTPUT_PREFIX": "out/",
        "MODEL": "breast-cancer",
        "INPUT_FORMAT": "jsonl",
    }.items():
        monkeypatch.setenv(f"SERVESTACK_BATCH_{key}", value)
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "breast-cancer")
    return unique


def test_a_completed_job_gets_a_manifest_and_an_error_file_by_input_line(aws: Aws, environment: str) -> None:
    # GIVEN a finished job's answers: 30 good rows and a malformed one, in two objects
    bucket = environment
    seed_job_output(aws, bucket)
    # WHEN SageMaker's job state change event says Completed
    result = transform_done(event(), LambdaContext("done", 900, 2048))
    # THEN the manifest counts every row, one part per input object, and names the job as the run
    manifest = json.loads(aws.s3.get_object(Bucket=bucket, Key="out/manifest.json")["Body"].read())
    assert result == {"manifest": f"s3://{bucket}/out/manifest.json", "rows": manifest["rows"]}
    assert manifest["rows"] == {"total": 31, "succeeded": 30, "failed": 1}
    assert manifest["run"] == "servestack-scores-d32c5kddcf5bb8c3"
    assert [(p["key"], p["input"], p["rows"], p["errors"]) for p in manifest["parts"]] == [
        ("a.jsonl.out", "in/a.jsonl", 12, 0),
        ("b.jsonl.out", "in/b.jsonl", 18, 1),
    ]
    # AND the bad row is in the error file under its input line (the blank line 4 is not a row)
    (error,) = [
        json.loads(line)
        for line in aws.s3.get_object(Bucket=bucket, Key="out/errors.jsonl")["Body"].read().splitlines()
    ]
    assert (error["file"], error["line"], error["error"]["type"]) == ("in/b.jsonl", 5, "InvalidInput")
    # AND the answers for an object that is not input are gone
    listed = {o["Key"] for o in aws.s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    run = "out/manifests/servestack-scores-d32c5kddcf5bb8c3.json"  # the run's own copy, kept after later runs
    assert listed == {"out/a.jsonl.out", "out/b.jsonl.out", "out/errors.jsonl", "out/manifest.json", run}


def test_a_failed_job_raises_with_sagemakers_reason_and_writes_no_manifest(aws: Aws, environment: str) -> None:
    # GIVEN a job that failed
    bucket = environment
    seed_job_output(aws, bucket)
    # WHEN its event arrives / THEN the step raises (the failure alarm counts it), with SageMaker's reason
    with pytest.raises(InternalError, match="ended Failed: ClientError: a record is larger"):
        transform_done(event("Failed", FailureReason="ClientError: a record is larger"), LambdaContext("d", 900, 2048))
    listed = {o["Key"] for o in aws.s3.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", [])}
    assert "out/manifest.json" not in listed


def test_answers_that_do_not_match_the_input_lines_stop_the_run_before_a_manifest(aws: Aws, environment: str) -> None:
    # GIVEN a `.out` that lost its last answer line
    bucket = environment
    seed_job_output(aws, bucket)
    short = aws.s3.get_object(Bucket=bucket, Key="out/a.jsonl.out")["Body"].read().splitlines(keepends=True)[:-1]
    aws.s3.put_object(Bucket=bucket, Key="out/a.jsonl.out", Body=b"".join(short))
    # WHEN the step runs / THEN it stops, naming the object, and writes no manifest
    with pytest.raises(InternalError, match=r"out/a\.jsonl\.out: fewer answers than in/a\.jsonl has lines"):
        transform_done(event(), LambdaContext("done", 900, 2048))
    listed = {o["Key"] for o in aws.s3.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", [])}
    assert "out/manifest.json" not in listed
