"""Async mode end to end on a real AWS endpoint: submit -> SQS -> worker -> S3 + DynamoDB."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import servestack.adapters.asynchronous
from servestack.adapters.aws.jobs import job_id_for
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from servestack.local.lambda_.runtime import LambdaContext
from tests.conftest import ARTIFACTS
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws

SAMPLE = (ARTIFACTS / "breast-cancer" / "1" / "sample-request.json").read_bytes()
POISON = json.dumps({"instances": [[1.0] * 29]})  # 29 features: the model takes 30


@pytest.fixture
def deployment(aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[AsyncDeploymentUnderTest]:
    yield deploy_async(aws, unique, monkeypatch, batch_size=10, batch_window_sec=0, max_receive_count=2)
    servestack.adapters.asynchronous.service.cache_clear()


def expected_result(body: bytes) -> Any:
    repository = ModelRepository(ServingSettings(warmup=False))
    repository.load_all()
    return json.loads(repository.get("breast-cancer").infer(body, "application/json", None).body)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def test_submit_then_worker_writes_the_result_and_status_links_it(deployment: AsyncDeploymentUnderTest) -> None:
    # GIVEN a job submitted inline
    code, submitted = deployment.submit(SAMPLE)
    assert code == 202
    assert submitted["status"] == "queued"
    assert submitted["status_url"].endswith(f"/jobs/{submitted['job_id']}")
    # WHEN the poller feeds the queue to the worker
    deployment.drain()
    # THEN the status is succeeded and its presigned URL returns what the core predicts for the payload
    code, status = deployment.status(submitted["job_id"])
    assert code == 200
    assert status["status"] == "succeeded"
    assert status["result"]["location"].startswith(f"s3://{deployment.names.bucket}/{deployment.names.result_prefix}")
    assert json.loads(fetch(status["result"]["url"])) == expected_result(SAMPLE)


def test_a_redelivered_message_never_writes_a_second_result(deployment: AsyncDeploymentUnderTest) -> None:
    # GIVEN a job the worker completed, and the message it came in (as a redelivery would bring it again)
    _, submitted = deployment.submit(SAMPLE)
    message = deployment.receive_job_message(submitted["job_id"])
    poller = deployment.poller()
    from servestack.local.lambda_.poller import lambda_record

    event = {"Records": [lambda_record(message, poller.queue_arn)]}
    first = servestack.adapters.asynchronous.worker_handler(event, LambdaContext("worker", 120, 2048))
    job_id = submitted["job_id"]
    _, done = deployment.status(job_id)
    # WHEN the same message is delivered again, once normally and once after a crash between the result
    # write and the status update (the record still says `running`)
    second = servestack.adapters.asynchronous.worker_handler(event, LambdaContext("worker", 120, 2048))
    table = deployment.aws.dynamodb
    table.update_item(
        TableName=deployment.names.table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #s = :r",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":r": {"S": "running"}},
    )
    third = servestack.adapters.asynchronous.worker_handler(event, LambdaContext("worker", 120, 2048))
    # THEN every delivery succeeds, and there is exactly one result object, unchanged
    assert first == second == third == {"batchItemFailures": []}
    assert deployment.result_versions(job_id) == 1
    _, after = deployment.status(job_id)
    assert after["status"] == "succeeded"
    assert fetch(after["result"]["url"]) == fetch(done["result"]["url"])
    assert done["updated_at"] <= after["updated_at"]


def test_poison_payloads_fail_alone_then_reach_the_dlq_with_a_reason(deployment: AsyncDeploymentUnderTest) -> None:
    # GIVEN three good jobs and two poison ones in the same queue
    good = [deployment.submit(SAMPLE)[1]["job_id"] for _ in range(3)]
    bad = [deployment.submit(POISON)[1]["job_id"] for _ in range(2)]
    # WHEN the poller runs until the queue is empty (max receive count 2, visibility 1 s)
    poller = deployment.drain()
    # THEN the good jobs succeeded once each, and the poison ones failed with the field named...
    for job_id in good:
        assert deployment.status(job_id)[1]["status"] == "succeeded"
        assert deployment.result_versions(job_id) == 1
    for job_id in bad:
        status = deployment.status(job_id)[1]
        assert status["status"] == "failed"
        assert status["error"]["type"] == "InvalidInput"
        assert "30" in status["error"]["message"] or "30" in str(status["error"].get("allowed"))
        assert deployment.result_versions(job_id) == 0
    # ...and their messages are in the DLQ from their first receive, each carrying the reason
    assert poller.invocations >= 1
    dead = deployment.aws.sqs.receive_message(
        QueueUrl=deployment.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
    )
    assert sorted(json.loads(m["Body"])["job_id"] for m in dead["Messages"]) == sorted(bad)
    for message in dead["Messages"]:
        attributes = {name: value["StringValue"] for name, value in message["MessageAttributes"].items()}
        assert attributes["ErrorType"] == "InvalidInput"
        assert attributes["JobId"] == json.loads(message["Body"])["job_id"]
        assert attributes["ReceiveCount"] == "1"
        assert "30" in attributes["ErrorMessage"]


def test_large_payload_goes_through_a_presigned_upload(deployment: AsyncDeploymentUnderTest) -> None:
    # GIVEN an upload slot for a job
    code, slot = deployment.submit(json.dumps({"content_type": "application/json"}), path="/jobs/uploads")
    assert code == 201
    # WHEN the payload is PUT to the presigned URL (S3 notifies the queue) and the caller also confirms
    upload = urllib.request.Request(slot["upload"]["url"], data=SAMPLE, method="PUT", headers=slot["upload"]["headers"])
    with urllib.request.urlopen(upload, timeout=10) as response:
        assert response.status == 200
    code, _ = deployment.submit(b"", path=f"/jobs/{slot['job_id']}/confirm")
    assert code == 202
    deployment.drain()
    # THEN the job succeeded once, whichever of the two starts came first
    status = deployment.status(slot["job_id"])[1]
    assert status["status"] == "succeeded"
    assert deployment.result_versions(slot["job_id"]) == 1
    assert json.loads(fetch(status["result"]["url"])) == expected_result(SAMPLE)


def test_submit_refuses_what_it_cannot_take(deployment: AsyncDeploymentUnderTest, tmp_path: Path) -> None:
    # GIVEN an inline payload over the presign threshold, an unknown job id, an unsupported content type
    too_big = b"[" + b"1.0," * 70_000 + b"1.0]"
    # WHEN each is sent / THEN each gets its 4xx with the field and what is allowed
    code, body = deployment.submit(too_big)
    assert (code, body["error"]["type"]) == (413, "PayloadTooLarge")
    assert "/jobs/uploads" in body["error"]["message"]
    code, body = deployment.status("0" * 32)
    assert (code, body["error"]["type"]) == (404, "JobNotFound")
    code, body = deployment.submit(b"x", content_type="application/xml")
    assert (code, body["error"]["type"]) == (415, "UnsupportedMediaType")


class DyingQueue:
    """The queue client of a keyed submit that dies after claiming its key, before the job's message is sent."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs

    def send_message(self, **_: Any) -> None:
        raise SystemExit("the submit function died here")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sqs, name)


def test_a_keyed_submit_that_dies_after_its_claim_is_completed_by_a_retry_once_its_time_has_passed(
    deployment: AsyncDeploymentUnderTest,
) -> None:
    # GIVEN a submit with an idempotency key that claims the key for 3 s (room for the retry below to come within
    # them on a busy machine), then dies before sending the job's message
    jobs = servestack.adapters.asynchronous.service()
    jobs.settings = msgspec.structs.replace(jobs.settings, submit_timeout_sec=3)
    real_queue = jobs.sqs
    jobs.sqs = DyingQueue(real_queue)
    with pytest.raises(SystemExit):
        jobs.submit(SAMPLE, "application/json", None, idempotency_key="order-17")
    jobs.sqs = real_queue
    job_id = job_id_for("order-17")
    # WHEN the client retries at once THEN it is told the request is still in progress (409, retryable)
    code, answer = deployment.submit_with(SAMPLE, {"Idempotency-Key": "order-17"})
    assert (code, answer["error"]["type"]) == (409, "IdempotencyInProgress")
    assert answer["error"]["field"] == "Idempotency-Key"
    # AND once the dead call's time has passed, a retry takes the claim over and submits the job
    retried = wait_for(lambda: answer_unless_409(deployment, SAMPLE, "order-17"), timeout_sec=60)
    assert (retried[0], retried[1]["job_id"]) == (202, job_id)
    # WHEN the worker runs the queue THEN the job ran, once
    deployment.drain()
    assert deployment.status(job_id)[1]["status"] == "succeeded"
    assert deployment.result_versions(job_id) == 1
    # AND a later retry replays it and enqueues nothing
    code, replayed = deployment.submit_with(SAMPLE, {"Idempotency-Key": "order-17"})
    assert (code, replayed["job_id"], replayed["status"], replayed["replayed"]) == (202, job_id, "succeeded", True)
    assert deployment.depth(deployment.queue_url) == 0


def answer_unless_409(deployment: AsyncDeploymentUnderTest, body: bytes, key: str) -> tuple[int, Any] | None:
    code, answer = deployment.submit_with(body, {"Idempotency-Key": key})
    return None if code == 409 else (code, answer)


def wait_for(check: Any, timeout_sec: float) -> Any:
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"not true after {timeout_sec} s")


def test_retries_with_an_idempotency_key_are_one_job_and_another_body_is_422(
    deployment: AsyncDeploymentUnderTest,
) -> None:
    # GIVEN five retries of one submit under one key, and two submits without a key
    answers = [deployment.submit_with(SAMPLE, {"Idempotency-Key": "batch-2026-11-30"}) for _ in range(5)]
    plain = [deployment.submit(SAMPLE)[1]["job_id"] for _ in range(2)]
    # THEN the retries are one job (the first is new, the rest replays) and the keyless submits are two
    assert {code for code, _ in answers} == {202}
    assert len({answer["job_id"] for _, answer in answers}) == 1
    assert [answer.get("replayed", False) for _, answer in answers] == [False, True, True, True, True]
    assert len(set(plain)) == 2
    # AND the same key with another body is refused, naming the header
    code, refused = deployment.submit_with(POISON.encode(), {"Idempotency-Key": "batch-2026-11-30"})
    assert (code, refused["error"]["type"], refused["error"]["field"]) == (
        422,
        "IdempotencyConflict",
        "Idempotency-Key",
    )
    # AND the queue ran the keyed job once: three jobs, three results
    deployment.drain()
    for job_id in [answers[0][1]["job_id"], *plain]:
        assert deployment.status(job_id)[1]["status"] == "succeeded"
        assert deployment.result_versions(job_id) == 1


def test_a_gzipped_submit_is_decoded_and_a_bomb_is_413(deployment: AsyncDeploymentUnderTest) -> None:
    import gzip

    code, accepted = deployment.submit_with(gzip.compress(SAMPLE), {"Content-Encoding": "gzip"})
    assert code == 202
    code, bomb = deployment.submit_with(gzip.compress(b" " * 50_000_000), {"Content-Encoding": "gzip"})
    assert (code, bomb["error"]["type"]) == (413, "PayloadTooLarge")
    deployment.drain()
    status = deployment.status(accepted["job_id"])[1]
    assert status["status"] == "succeeded"
    assert json.loads(fetch(status["result"]["url"])) == expected_result(SAMPLE)


@pytest.mark.parametrize("job_id", ["x" * 5000, "../../etc", "a b", "%00"])
def test_a_status_request_for_a_hostile_job_id_is_404(deployment: AsyncDeploymentUnderTest, job_id: str) -> None:
    # GIVEN a job id that is no job id (too long for a table key, a path, a space) WHEN its status is asked
    code, body = deployment.status(job_id)
    # THEN the answer is a JSON 404 (no such job, or no such route), never a 500
    assert code == 404
    assert body["error"]["type"] in ("JobNotFound", "NotFound")
    assert len(json.dumps(body)) < 2000
