"""A 5,000-digit integer in async and batch mode, on a real AWS endpoint (issue 37, finding 5): Python's int()
refuses past 4,300 digits with a ValueError that nothing caught. An async job with one was retried as if the
worker had failed, then given up on as a `ValueError`; a batch run with one stopped with no manifest, losing
its good rows. Now the job fails at once as the caller's `InvalidInput` naming the cell, and the batch run
scores every good row and reports the bad one as an error row. (Realtime and serverless:
tests/functional/test_hostile_inputs.py.)

The model is an int64 one with columns a, b, c (tests/tabular_fixtures.py `counting_package`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import servestack.adapters.asynchronous
from servestack.adapters.batch import BatchSettings, run_batch
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket
from tests.tabular_fixtures import counting_package

pytestmark = pytest.mark.localstack
FIVE_THOUSAND_DIGITS = "9" * 5000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("counting-models")
    counting_package(folder)
    return folder


@pytest.fixture
def counting(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "counting")
    return model_dir


@pytest.fixture
def deployment(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> Iterator[AsyncDeploymentUnderTest]:
    deployed = deploy_async(aws, unique, monkeypatch, batch_size=10, batch_window_sec=0, max_receive_count=2)
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "counting")
    servestack.adapters.asynchronous.service.cache_clear()
    yield deployed
    servestack.adapters.asynchronous.service.cache_clear()


def test_an_async_job_with_a_5000_digit_cell_fails_at_once_naming_it(deployment: AsyncDeploymentUnderTest) -> None:
    # GIVEN a good CSV job and one whose second row ends in a 5,000-digit integer, in the same queue
    headers = {"content-type": "text/csv; header=present"}
    code, good = deployment.submit_with(b"a,b,c\n1,2,3\n4,5,6\n", headers)
    assert code == 202, good
    code, bad = deployment.submit_with(f"a,b,c\n1,2,3\n4,5,{FIVE_THOUSAND_DIGITS}\n".encode(), headers)
    assert code == 202, bad
    # WHEN the worker runs until the queue is empty (max receive count 2)
    deployment.drain()
    # THEN the good job succeeded, and the bad one failed as the caller's InvalidInput naming the cell, on its
    # first receive (not retried as a worker failure and given up on)
    assert deployment.status(good["job_id"])[1]["status"] == "succeeded"
    status = deployment.status(bad["job_id"])[1]
    assert status["status"] == "failed", status
    assert status["error"]["type"] == "InvalidInput", status["error"]
    assert status["error"]["field"] == "csv.c[1]"
    assert "gave up" not in status["error"]["message"]
    dead = deployment.aws.sqs.receive_message(
        QueueUrl=deployment.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
    )
    (message,) = dead["Messages"]
    assert message["MessageAttributes"]["ReceiveCount"]["StringValue"] == "1"


def test_a_batch_run_with_a_5000_digit_cell_scores_every_good_row(aws: Aws, unique: str, counting: Path) -> None:
    # GIVEN 101 good rows in three files, and two bad ones: a CSV cell of 5,000 digits, and a JSON line holding
    # one beside a NaN (which makes the codec fall back to Python's parser, which refuses it)
    ensure_bucket(aws.s3, unique)
    a_rows = [f"{i},{i + 1},{i + 2}" for i in range(40)]
    a_rows.insert(20, f"7,8,{FIVE_THOUSAND_DIGITS}")
    b_rows = [json.dumps({"a": i, "b": 0, "c": 1}) for i in range(30)]
    b_rows.insert(5, f'{{"a": NaN, "b": 1, "c": {FIVE_THOUSAND_DIGITS}}}')
    files = {
        "a.csv": "a,b,c\n" + "\n".join(a_rows) + "\n",
        "b.jsonl": "\n".join(b_rows) + "\n",
        "c.csv": "\n".join(f"{i},{-i},5" for i in range(31)) + "\n",  # no header: the model's column order
    }
    for name, text in files.items():
        aws.s3.put_object(Bucket=unique, Key=f"in/{name}", Body=text.encode())
    # WHEN the job runs
    settings = BatchSettings(
        deployment="t", bucket=unique, input_prefix="in/", output_prefix="out/", model="counting", chunk_rows=16
    )
    manifest = run_batch(settings)
    # THEN the manifest accounts for every row: the 101 good ones scored, the two bad ones error rows
    assert manifest["rows"] == {"total": 103, "succeeded": 101, "failed": 2}
    assert [entry["outcome"] for entry in manifest["inputs"]] == ["read"] * 3
    body = aws.s3.get_object(Bucket=unique, Key="out/errors.jsonl")["Body"].read()
    errors = [json.loads(line) for line in body.splitlines()]
    assert [(error["file"], error["line"]) for error in errors] == [("in/a.csv", 22), ("in/b.jsonl", 6)]
    assert errors[0]["error"]["type"] == errors[1]["error"]["type"] == "InvalidInput"
    assert "at most 19 digits" in errors[0]["error"]["allowed"]
