"""Async mode with a user's tabular model: a CSV job whose header names the columns, answered as CSV with a
header row, and a records job answered with probabilities keyed by label. The request and answer types ride
with the job (its record keeps `text/csv; header=present`), so the worker reads and writes what the caller
asked for, as the realtime and serverless paths do."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

import servestack.adapters.asynchronous
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws
from tests.pipeline_model import COLUMNS, SPECIES, PipelineModel, pipeline_model


@pytest.fixture
def deployment(aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[AsyncDeploymentUnderTest]:
    deployed = deploy_async(aws, unique, monkeypatch, batch_size=10, batch_window_sec=0, max_receive_count=2)
    built = pipeline_model()
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(built.root))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "flowers")
    servestack.adapters.asynchronous.service.cache_clear()
    yield deployed
    servestack.adapters.asynchronous.service.cache_clear()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def finished(deployment: AsyncDeploymentUnderTest, job_id: str) -> bytes:
    deployment.drain()
    code, status = deployment.status(job_id)
    assert code == 200
    assert status["status"] == "succeeded", status
    return fetch(status["result"]["url"])


def test_a_csv_job_with_a_header_is_read_by_name_and_answered_with_one(deployment: AsyncDeploymentUnderTest) -> None:
    built: PipelineModel = pipeline_model()
    # GIVEN rows as CSV under a header in another order than the model's columns
    order = list(reversed(COLUMNS))
    lines = [",".join(order)] + [
        ",".join(str(built.rows[name][i]) for name in order) for i in range(len(built.expected))
    ]
    headers = {"content-type": "text/csv; header=present", "accept": "text/csv; header=present"}
    # WHEN the job is submitted and the worker runs it
    code, submitted = deployment.submit_with("\n".join(lines).encode(), headers)
    assert code == 202, submitted
    table = finished(deployment, submitted["job_id"]).decode().splitlines()
    # THEN the result is CSV with a header row and the estimator's predictions
    assert table[0] == "prediction," + ",".join(f"proba_{label}" for label in SPECIES)
    assert [line.split(",")[0] for line in table[1:]] == built.expected


def test_a_records_job_answers_probabilities_by_label(deployment: AsyncDeploymentUnderTest) -> None:
    built = pipeline_model()
    records = [{name: built.rows[name][i] for name in COLUMNS} for i in range(len(built.expected))]
    headers = {"accept": "application/json; probabilities=by-label"}
    code, submitted = deployment.submit_with(orjson.dumps({"dataframe_records": records}), headers)
    assert code == 202, submitted
    answer = json.loads(finished(deployment, submitted["job_id"]))
    assert answer["predictions"] == built.expected
    assert [max(row, key=row.get) for row in answer["probabilities"]] == built.expected
