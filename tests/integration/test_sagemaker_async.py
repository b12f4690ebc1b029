"""`backend: sagemaker` end to end on a real AWS endpoint (moto over HTTP) and a real container: the submit handler
calls InvokeEndpointAsync through botocore; the local stand-in for SageMaker runs the container, writes S3 and
publishes to SNS; SNS feeds a queue of its own (raw delivery); the notification handler records the outcome;
the status API answers as for the Lambda backend."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import servestack.adapters.asynchronous
from servestack.local.hosting.http_server import LocalHttpServer, Reply, Request
from servestack.local.lambda_.poller import SqsPoller
from servestack.local.lambda_.runtime import LocalFunction
from servestack.local.sagemaker.async_inference import AsyncInferenceConfig, AsyncInvocations
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws

pytestmark = pytest.mark.slow
SAMPLE = (ARTIFACTS / "breast-cancer" / "1" / "sample-request.json").read_bytes()
POISON = json.dumps({"instances": [[1.0] * 29]})  # 29 features: the model takes 30


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    server = RealtimeServer.start(
        tmp_path_factory.mktemp("async-container"), env={"SERVESTACK_DEFAULT_MODEL": "breast-cancer"}
    )
    yield server
    server.stop()


class SageMakerBackend:
    """SNS topics -> notification queue, and the SageMaker stand-in behind a sagemaker-runtime endpoint URL."""

    def __init__(self, aws: Aws, deployment: AsyncDeploymentUnderTest, container: RealtimeServer) -> None:
        n = deployment.names
        self.aws = aws
        self.endpoint_name = n.resource
        self.failure_prefix = f"async/{n.resource}/failures/"
        self.success_topic = aws.sns.create_topic(Name=f"{n.resource}-succeeded")["TopicArn"]
        self.error_topic = aws.sns.create_topic(Name=f"{n.resource}-failed")["TopicArn"]
        self.queue_url = aws.sqs.create_queue(QueueName=f"{n.resource}-notifications")["QueueUrl"]
        queue_arn = aws.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        for topic in (self.success_topic, self.error_topic):
            aws.sns.subscribe(
                TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"}
            )
        self.sagemaker = AsyncInvocations(
            endpoint_name=self.endpoint_name,
            container_url=container.url,
            config=AsyncInferenceConfig(
                output_path=f"s3://{n.bucket}/{n.result_prefix}",
                failure_path=f"s3://{n.bucket}/{self.failure_prefix}",
                success_topic=self.success_topic,
                error_topic=self.error_topic,
            ),
            s3=aws.s3,
            sns=aws.sns,
        )
        self.api = LocalHttpServer("sagemaker-runtime", self._route).serve_in_background()

    def _route(self, request: Request) -> Reply:
        name = request.path.removeprefix("/endpoints/").split("/")[0]
        return self.sagemaker.handle(name, request)

    def deliver_notifications(self, expected: int, timeout_sec: float = 30) -> SqsPoller:
        """Run the notification function on the queue's messages, as Lambda's SQS event source would."""
        function = LocalFunction("notifier", servestack.adapters.asynchronous.notification_handler, timeout_sec=30)
        poller = SqsPoller(self.aws.sqs, self.queue_url, function, batch_size=10, batch_window_sec=0, wait_sec=1)
        deadline = time.monotonic() + timeout_sec
        while poller.invocations < expected and time.monotonic() < deadline:
            poller.run_once(threading.Event())
        return poller

    def close(self) -> None:
        self.api.close()
        self.sagemaker.close()


@pytest.fixture
def backend(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, container: RealtimeServer
) -> Iterator[tuple[AsyncDeploymentUnderTest, SageMakerBackend]]:
    deployment = deploy_async(aws, unique, monkeypatch, backend="sagemaker")
    sagemaker = SageMakerBackend(aws, deployment, container)
    monkeypatch.setenv("SERVESTACK_ASYNC_BACKEND", "sagemaker")
    monkeypatch.setenv("SERVESTACK_ENDPOINT_NAME", sagemaker.endpoint_name)
    monkeypatch.setenv("SERVESTACK_FAILURE_PREFIX", sagemaker.failure_prefix)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", sagemaker.api.url)  # botocore's per-service endpoint
    servestack.adapters.asynchronous.service.cache_clear()
    servestack.adapters.asynchronous.recorder.cache_clear()
    yield deployment, sagemaker
    sagemaker.close()
    servestack.adapters.asynchronous.service.cache_clear()
    servestack.adapters.asynchronous.recorder.cache_clear()


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:  # a presigned URL on the test's endpoint
        return json.loads(response.read())


def test_a_job_succeeds_and_a_poison_job_fails_with_the_containers_reason(
    backend: tuple[AsyncDeploymentUnderTest, SageMakerBackend], container: RealtimeServer
) -> None:
    deployment, sagemaker = backend
    # GIVEN an async deployment whose jobs run on a SageMaker async endpoint
    # WHEN a good job and a poison job are submitted through the submit API
    status, good = deployment.submit(SAMPLE)
    assert status == 202, good
    status, poison = deployment.submit(POISON)
    assert status == 202, poison
    assert deployment.status(good["job_id"])[1]["status"] == "queued"
    sagemaker.sagemaker.wait_idle()
    # AND SageMaker's notifications reach the notification function through their queue
    poller = sagemaker.deliver_notifications(expected=1)

    # THEN the good job succeeded: its result is the container's answer to the same payload
    status, done = deployment.status(good["job_id"])
    assert status == 200
    assert done["status"] == "succeeded", done
    assert done["result"]["location"].startswith(f"s3://{deployment.names.bucket}/{deployment.names.result_prefix}")
    assert done["result"]["content_type"] == "application/json"
    direct = json.loads(
        urllib.request.urlopen(
            urllib.request.Request(
                f"{container.url}/invocations", data=SAMPLE, headers={"Content-Type": "application/json"}
            ),
            timeout=10,
        ).read()
    )
    assert fetch(done["result"]["url"]) == direct
    # AND the poison job failed with the container's own error, as the Lambda backend reports it
    status, failed = deployment.status(poison["job_id"])
    assert failed["status"] == "failed", failed
    assert failed["error"]["type"] == "InvalidInput"
    assert failed["error"]["field"]
    assert "allowed" in failed["error"]
    # AND every notification was acknowledged, and the Lambda worker's queue was never used
    assert poller.invocations >= 1
    assert (
        sagemaker.aws.sqs.get_queue_attributes(
            QueueUrl=sagemaker.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        == "0"
    )
    leftovers = deployment.aws.sqs.receive_message(QueueUrl=deployment.queue_url, MaxNumberOfMessages=10)
    assert [m for m in leftovers.get("Messages", []) if "job_id" in json.loads(m["Body"])] == []


def test_notifications_delivered_twice_or_late_change_nothing(
    backend: tuple[AsyncDeploymentUnderTest, SageMakerBackend],
) -> None:
    deployment, sagemaker = backend
    # GIVEN a job that succeeded
    _, job = deployment.submit(SAMPLE)
    sagemaker.sagemaker.wait_idle()
    sagemaker.deliver_notifications(expected=1)
    _, first = deployment.status(job["job_id"])
    assert first["status"] == "succeeded"
    recorder = servestack.adapters.asynchronous.recorder()
    # WHEN the success is delivered again, and an error for the same job arrives after it
    success = {
        "invocationStatus": "Completed",
        "inferenceId": job["job_id"],
        "responseParameters": {"contentType": "application/json", "outputLocation": first["result"]["location"]},
    }
    recorder.record(json.dumps(success))
    recorder.record(json.dumps({"Type": "Notification", "Message": json.dumps(
        {"invocationStatus": "Failed", "inferenceId": job["job_id"], "failureReason": "late"}
    )}))  # fmt: skip
    # THEN the job stays succeeded, with the same result
    _, again = deployment.status(job["job_id"])
    assert again["status"] == "succeeded"
    assert again["result"]["location"] == first["result"]["location"]
    # AND a notification for a job with no record yet (SageMaker can answer before submit, which invokes first,
    # writes the record) fails so that SQS delivers it again; it never creates a record of its own
    from servestack.adapters.aws.sagemaker_jobs import JobNotYetRecorded

    with pytest.raises(JobNotYetRecorded):
        recorder.record(json.dumps(success | {"inferenceId": "no-such-job"}))
    assert deployment.status("no-such-job")[0] == 404
