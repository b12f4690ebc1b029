"""The local SQS event source mapping on a real queue: deletes successes, redelivers failures, DLQ after
maxReceiveCount; and the S3 upload notification reaches the queue in a shape the worker reads."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from servestack.adapters.aws.jobs import parse_message
from servestack.local.lambda_.poller import SqsPoller
from servestack.local.lambda_.runtime import LocalFunction
from tests.integration.conftest import Aws
from tests.integration.resources import ensure_bucket

pytestmark = pytest.mark.localstack


def queue_with_dlq(aws: Aws, name: str, max_receive_count: int = 2) -> tuple[str, str]:
    dlq = aws.sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = aws.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)})
    queue = aws.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "1", "RedrivePolicy": redrive})
    return queue["QueueUrl"], dlq


class RecordingWorker:
    """A worker that fails the records whose body is "poison", and remembers every event it got."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        self.events.append(event)
        failed = [r["messageId"] for r in event["Records"] if r["body"] == "poison"]
        return {"batchItemFailures": [{"itemIdentifier": m} for m in failed]}


def test_poller_sends_lambda_shaped_batches_and_poison_reaches_the_dlq(aws: Aws, unique: str) -> None:
    # GIVEN a queue with a DLQ (max receive count 2) holding 4 good messages and 1 poison one
    queue, dlq = queue_with_dlq(aws, unique)
    for body in ["a", "b", "poison", "c", "d"]:
        aws.sqs.send_message(QueueUrl=queue, MessageBody=body)
    worker = RecordingWorker()
    poller = SqsPoller(aws.sqs, queue, LocalFunction("w", worker, timeout_sec=10), batch_size=5, wait_sec=1)
    # WHEN the poller runs until the queue is empty
    stop = threading.Event()
    deadline = time.monotonic() + 30
    dead: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not dead:
        poller.run_once(stop)
        dead = aws.sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=0).get("Messages", [])
    # THEN each event has Lambda's SQS record shape
    record = worker.events[0]["Records"][0]
    assert set(record) == {
        "messageId", "receiptHandle", "body", "attributes", "messageAttributes", "md5OfBody", "eventSource",
        "eventSourceARN", "awsRegion",
    }  # fmt: skip
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"].endswith(f":{unique}")
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    # AND good messages were delivered once and deleted; the poison one was retried, then dead-lettered
    bodies = [r["body"] for e in worker.events for r in e["Records"]]
    assert sorted(b for b in bodies if b != "poison") == ["a", "b", "c", "d"]
    assert bodies.count("poison") == 2
    assert [m["Body"] for m in dead] == ["poison"]


def test_without_report_batch_item_failures_a_normal_return_settles_the_whole_batch(aws: Aws, unique: str) -> None:
    # GIVEN a mapping without ReportBatchItemFailures, and a worker that names a failed record anyway
    queue, dlq = queue_with_dlq(aws, unique)
    for body in ["a", "poison"]:
        aws.sqs.send_message(QueueUrl=queue, MessageBody=body)
    worker = RecordingWorker()
    poller = SqsPoller(aws.sqs, queue, LocalFunction("w", worker, timeout_sec=10), batch_size=5, wait_sec=1,
                       report_batch_item_failures=False)  # fmt: skip
    # WHEN the poller runs once
    handled = poller.run_once(threading.Event())
    while handled < 2:
        handled += poller.run_once(threading.Event())
    # THEN, as Lambda ignores the response's batchItemFailures then, both messages are deleted
    # (deliberately past the queue's 1 s visibility timeout, by which a message not deleted is visible again: a
    # slower machine only waits further past it)
    time.sleep(1.5)
    assert aws.sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0).get("Messages", []) == []
    assert aws.sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=0).get("Messages", []) == []


def test_an_upload_notification_names_the_job(aws: Aws, unique: str) -> None:
    # GIVEN a bucket notifying a queue of objects created under the uploads prefix
    queue, _ = queue_with_dlq(aws, unique)
    arn = aws.sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    ensure_bucket(aws.s3, unique)
    prefix = f"async/servestack-{unique}/requests/uploads/"
    aws.s3.put_bucket_notification_configuration(
        Bucket=unique,
        NotificationConfiguration={"QueueConfigurations": [{
            "QueueArn": arn, "Events": ["s3:ObjectCreated:*"],
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}},
        }]},
    )  # fmt: skip
    # WHEN a payload is uploaded there
    aws.s3.put_object(Bucket=unique, Key=f"{prefix}abc123", Body=b'{"instances": []}')
    # THEN the queue gets a message the worker reads as that job (after S3's test event, which it skips)
    refs = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not refs:
        for m in aws.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            ref = parse_message(m["Body"])
            if ref is not None:
                refs.append(ref)
    assert [(r.job_id, r.bucket, r.key) for r in refs] == [("abc123", unique, f"{prefix}abc123")]
