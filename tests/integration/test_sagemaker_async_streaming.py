"""The SageMaker async stand-in with bodies past its buffers, on moto over HTTP and a real HTTP container that
echoes what it is sent: the input reaches the container whole with its declared length (streamed from S3, not
chunked), the answer lands in S3 in parts (spooled, then a multipart upload), and an input that cannot be read
is SageMaker's failure notification."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from servestack.local.hosting.http_server import LocalHttpServer, Reply, Request
from servestack.local.sagemaker.async_inference import PART_BYTES, SPOOL_BYTES, AsyncInferenceConfig, AsyncInvocations
from tests.integration.conftest import Aws

pytestmark = pytest.mark.slow
LARGE = 2 * PART_BYTES + 12345  # three parts of output, past the spool's memory
assert LARGE > SPOOL_BYTES


class Echo:
    """A container that answers each body with itself, and notes the framing each request came with."""

    def __init__(self) -> None:
        self.framing: list[tuple[str | None, str | None]] = []
        self.server = LocalHttpServer("echo", self.handle, max_body_bytes=4 * LARGE).serve_in_background()

    def handle(self, request: Request) -> Reply:
        self.framing.append((request.header("content-length"), request.header("transfer-encoding")))
        return Reply(200, {"Content-Type": "application/octet-stream"}, request.body)


@pytest.fixture
def setup(aws: Aws, unique: str) -> Iterator[tuple[Aws, str, AsyncInvocations, Echo, str]]:
    bucket = f"{unique}-async"
    aws.s3.create_bucket(Bucket=bucket)
    success = aws.sns.create_topic(Name=f"{unique}-ok")["TopicArn"]
    error = aws.sns.create_topic(Name=f"{unique}-failed")["TopicArn"]
    queue = aws.sqs.create_queue(QueueName=f"{unique}-notes")["QueueUrl"]
    arn = aws.sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for topic in (success, error):
        aws.sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    echo = Echo()
    invocations = AsyncInvocations(
        endpoint_name=unique,
        container_url=echo.server.url,
        config=AsyncInferenceConfig(
            output_path=f"s3://{bucket}/results/",
            failure_path=f"s3://{bucket}/failures/",
            success_topic=success,
            error_topic=error,
        ),
        s3=aws.s3,
        sns=aws.sns,
    )
    yield aws, bucket, invocations, echo, queue
    invocations.close()
    echo.server.close()


def notification(aws: Aws, queue: str) -> dict[str, Any]:
    """The one notification on the queue (published before `wait_idle` returned)."""
    messages = aws.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=10).get("Messages", [])
    assert len(messages) == 1, messages
    found: dict[str, Any] = json.loads(messages[0]["Body"])
    return found


def test_a_large_input_is_streamed_to_the_container_and_its_answer_stored_in_parts(
    setup: tuple[Aws, str, AsyncInvocations, Echo, str],
) -> None:
    aws, bucket, invocations, echo, queue = setup
    # GIVEN an input past the stand-in's chunk, spool and part sizes
    payload = os.urandom(LARGE)
    aws.s3.put_object(Bucket=bucket, Key="requests/large.bin", Body=payload)
    # WHEN it is invoked
    accepted = invocations.invoke(input_location=f"s3://{bucket}/requests/large.bin", content_type="x/y")
    invocations.wait_idle()
    # THEN the container got it whole, framed by its length (a plain body, as SageMaker sends it)
    assert echo.framing == [(str(LARGE), None)]
    # AND the answer is the output object, written in three parts
    out_bucket, _, out_key = accepted.output_location.removeprefix("s3://").partition("/")
    stored = aws.s3.get_object(Bucket=out_bucket, Key=out_key)
    assert stored["Body"].read() == payload
    assert stored["ETag"].strip('"').endswith("-3")
    assert stored["ContentType"] == "application/octet-stream"
    # AND SageMaker's success notification says where
    note = notification(aws, queue)
    assert note["invocationStatus"] == "Completed"
    assert note["responseParameters"]["outputLocation"] == accepted.output_location


def test_an_input_that_is_not_there_fails_with_sagemakers_reason(
    setup: tuple[Aws, str, AsyncInvocations, Echo, str],
) -> None:
    aws, bucket, invocations, echo, queue = setup
    # WHEN the input location names no object
    invocations.invoke(input_location=f"s3://{bucket}/requests/missing.bin")
    invocations.wait_idle()
    # THEN the container is never called, and the error topic says the input could not be downloaded
    assert echo.framing == []
    note = notification(aws, queue)
    assert note["invocationStatus"] == "Failed"
    assert note["failureReason"] == "ClientError: Failed to download input data (NoSuchKey)"
