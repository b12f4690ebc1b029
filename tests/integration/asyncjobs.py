"""A helper shared by the async integration tests: one async deployment on the test's AWS endpoint."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from servestack.local.lambda_.poller import SqsPoller
from servestack.local.lambda_.runtime import LambdaContext, LocalFunction, http_api_event
from servestack.spec import AsyncDeployment, ServingSpec, parse_spec
from tests.integration.conftest import Aws
from tests.integration.resources import Names, ensure_async, environment, names


@dataclass
class AsyncDeploymentUnderTest:
    aws: Aws
    spec: ServingSpec
    name: str
    names: Names
    queue_url: str
    dlq_url: str

    def submit(self, body: bytes | str, content_type: str = "application/json", path: str = "/jobs") -> tuple[int, Any]:
        from servestack.adapters.asynchronous import submit_handler

        raw = body.encode() if isinstance(body, str) else body
        event = http_api_event("POST", path, {"content-type": content_type}, raw, "jobs.local", "127.0.0.1")
        response = submit_handler(event, LambdaContext("submit", 15, 512))
        return response["statusCode"], json.loads(response["body"])

    def submit_with(self, body: bytes, headers: dict[str, str], path: str = "/jobs") -> tuple[int, Any]:
        """POST with extra headers (Idempotency-Key, Content-Encoding...), through the submit handler."""
        from servestack.adapters.asynchronous import submit_handler

        event = http_api_event("POST", path, {"content-type": "application/json", **headers}, body, "jobs.local", "x")
        response = submit_handler(event, LambdaContext("submit", 15, 512))
        return response["statusCode"], json.loads(response["body"])

    def status(self, job_id: str) -> tuple[int, Any]:
        from servestack.adapters.asynchronous import submit_handler

        event = http_api_event("GET", f"/jobs/{job_id}", {}, b"", "jobs.local", "127.0.0.1")
        response = submit_handler(event, LambdaContext("submit", 15, 512))
        return response["statusCode"], json.loads(response["body"])

    def poller(self) -> SqsPoller:
        from servestack.adapters.asynchronous import worker_handler

        d = self.spec.deployments[self.name]
        assert isinstance(d, AsyncDeployment)
        function = LocalFunction("worker", worker_handler, timeout_sec=d.timeout_sec)
        return SqsPoller(
            self.aws.sqs,
            self.queue_url,
            function,
            batch_size=d.batch_size,
            batch_window_sec=d.batch_window_sec,
            wait_sec=1,
        )

    def drain(self, timeout_sec: float = 60) -> SqsPoller:
        """Run the poller until the queue holds nothing, visible or in flight."""
        poller = self.poller()
        stop = threading.Event()
        deadline = time.monotonic() + timeout_sec
        while time.monotonic() < deadline:
            poller.run_once(stop)
            if self.depth(self.queue_url) == 0:
                return poller
        raise TimeoutError(f"queue not drained after {timeout_sec}s")

    def receive_job_message(self, job_id: str, timeout_sec: float = 10) -> dict[str, Any]:
        """The queue message of `job_id` (skipping S3's `s3:TestEvent`, which a new notification sends)."""
        deadline = time.monotonic() + timeout_sec
        while time.monotonic() < deadline:
            response = self.aws.sqs.receive_message(QueueUrl=self.queue_url, AttributeNames=["All"], WaitTimeSeconds=1)
            for message in response.get("Messages", []):
                if json.loads(message["Body"]).get("job_id") == job_id:
                    return dict(message)
        raise TimeoutError(f"no message for job {job_id}")

    def depth(self, url: str) -> int:
        attributes = self.aws.sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

    def result_versions(self, job_id: str) -> int:
        key = f"{self.names.result_prefix}{job_id}"
        listed = self.aws.s3.list_object_versions(Bucket=self.names.bucket, Prefix=key)
        return len([v for v in listed.get("Versions", []) if v["Key"] == key])


def deploy_async(
    aws: Aws, name: str, monkeypatch: pytest.MonkeyPatch, *, visibility_timeout: int = 1, **settings: Any
) -> AsyncDeploymentUnderTest:
    import servestack.adapters.asynchronous

    spec = parse_spec(
        {
            "models": [{"name": "breast-cancer", "version": 1}],
            "deployments": {name: {"mode": "async", "model": "breast-cancer", **settings}},
        }
    )
    d = spec.deployments[name]
    assert isinstance(d, AsyncDeployment)
    queue_url = ensure_async(aws.clients, name, d, visibility_timeout=visibility_timeout)
    for key, value in environment(spec, name, queue_url=queue_url).items():
        monkeypatch.setenv(key, value)
    servestack.adapters.asynchronous.service.cache_clear()
    n = names(name, d)
    dlq_url = aws.sqs.get_queue_url(QueueName=n.dlq)["QueueUrl"]
    return AsyncDeploymentUnderTest(aws, spec, name, n, queue_url, dlq_url)
