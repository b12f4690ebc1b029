"""The realtime container as SageMaker Batch Transform runs it (`SAGEMAKER_BATCH=true`): /execution-parameters,
and /invocations answering a mini-batch of lines with one line per row, a bad row's line holding its error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import RealtimeServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def transform_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    # What SageMaker sets in a transform job's container, plus what servestack/cdk/batch.py sets on the model.
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1",
        "SERVESTACK_TRANSFORM_MAX_CONCURRENT_TRANSFORMS": "3",
    }
    server = RealtimeServer.start(tmp_path_factory.mktemp("transform"), env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(transform_server: RealtimeServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=transform_server.url, timeout=30) as client:
        yield client


def test_execution_parameters_answer_as_batch_transform_expects(client: httpx.Client) -> None:
    # WHEN SageMaker asks the container for its execution parameters
    response = client.get("/execution-parameters")
    # THEN it gets the three fields Batch Transform reads, with the job's values
    assert response.status_code == 200
    assert response.json() == {"MaxConcurrentTransforms": 3, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 1}


def test_a_mini_batch_of_lines_gets_one_answer_line_per_row_and_a_bad_row_its_error(
    client: httpx.Client, digits: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    # GIVEN a mini-batch of JSON lines: 5 rows, a blank line, a row of the wrong width
    features, _ = digits
    lines = [json.dumps(row.tolist()) for row in features[:5]]
    lines[2:2] = ["", json.dumps([1.0] * 63)]
    # WHEN Batch Transform posts it (SplitType Line, BatchStrategy MultiRecord)
    response = client.post(
        "/invocations", content="\n".join(lines).encode() + b"\n", headers={"content-type": "application/jsonlines"}
    )
    # THEN the answer holds one JSON line per non-blank line, in order
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/jsonlines"
    answers = [json.loads(line) for line in response.text.splitlines()]
    assert len(answers) == 6
    # AND the good rows hold the core's prediction, the bad row its error
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    model = repository.get("digits")
    expected = model.respond(model.predict({"input": features[:5]}))["predictions"].tolist()
    assert [a["prediction"] for i, a in enumerate(answers) if i != 2] == expected
    assert answers[2]["error"]["type"] == "InvalidInput"


def test_a_mini_batch_over_max_payload_is_refused_with_413(client: httpx.Client) -> None:
    # GIVEN a body over the job's MaxPayloadInMB (1 MB here)
    body = b"[" + b"0," * 600_000 + b"0]\n"
    # WHEN it is posted / THEN it is refused as too large, with a JSON error
    response = client.post("/invocations", content=body, headers={"content-type": "application/jsonlines"})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "PayloadTooLarge"


def test_the_realtime_container_also_answers_execution_parameters(realtime_server: RealtimeServer) -> None:
    # GIVEN the container outside a transform job (no SAGEMAKER_BATCH) / WHEN asked / THEN the defaults
    response = httpx.get(f"{realtime_server.url}/execution-parameters", timeout=10)
    assert response.json() == {"MaxConcurrentTransforms": 2, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}
