"""The local stand-in for what SageMaker does behind an asynchronous endpoint (`AsyncInferenceConfig`).

`InvokeEndpointAsync` answers at once (202, `InferenceId`, `OutputLocation`, `FailureLocation`); SageMaker then,
in the background, reads the payload from `InputLocation`, posts it to the container's `/invocations` (with the
request's Content-Type, Accept and custom attributes), and
- on a 2xx, writes the answer to `<S3OutputPath><uuid>.out` and publishes to the success topic
  `{"invocationStatus": "Completed", "inferenceId", "responseParameters": {"contentType", "outputLocation"},
  "requestParameters": {...}, "eventName": "InferenceResult", "eventSource": "aws:sagemaker", ...}`;
- otherwise, writes the container's answer to `<S3FailurePath><uuid>-error.out` and publishes to the error topic
  `{"invocationStatus": "Failed", "failureReason": "ClientError: Received client error (400) from model. See the
  SageMaker Endpoint logs in your account for more information.", "inferenceId", "requestParameters", ...}`.
These are the notification fields SageMaker documents (and public consumers parse);
servestack/adapters/aws/sagemaker_jobs.py reads them.

`AsyncInvocations(...).handle(endpoint_name, request)` serves the `POST /endpoints/{name}/async-invocations`
wire format of botocore's sagemaker-runtime model; `invoke(...)` is the same call from Python. `from_endpoint_config`
reads the endpoint config's `AsyncInferenceConfig` as a synthesized template holds it (refs resolved by the caller).
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

from servestack.local.cloudformation import DEFAULT_REGION as REGION
from servestack.local.hosting import Reply, Request, request_id
from servestack.local.sagemaker.multi_model import sagemaker_error

logger = logging.getLogger("servestack.sagemaker_async")
INVOCATION_TIMEOUT_SEC = 900  # SageMaker's default InvocationTimeoutSeconds for async endpoints (15 minutes)
# Payloads go up to 1 GB (servestack/aws_rules.py): the input is streamed from S3 to the container in chunks of
# CHUNK_BYTES, and the container's answer is spooled to a temporary file past SPOOL_BYTES, then uploaded to S3 in
# parts of PART_BYTES, one at a time, so that one invocation holds a few MiB of it in memory whatever its size.
CHUNK_BYTES = 1 << 20
SPOOL_BYTES = 8 << 20
PART_BYTES = 8 << 20


@dataclass(frozen=True)
class AsyncInferenceConfig:
    """The parts of an endpoint config's `AsyncInferenceConfig` that say where results and notifications go."""

    output_path: str  # S3OutputPath, s3://bucket/prefix/
    failure_path: str | None = None  # S3FailurePath
    success_topic: str | None = None  # NotificationConfig.SuccessTopic (an SNS topic ARN)
    error_topic: str | None = None  # NotificationConfig.ErrorTopic
    max_concurrent_invocations: int = 4  # ClientConfig.MaxConcurrentInvocationsPerInstance

    @classmethod
    def from_endpoint_config(cls, properties: dict[str, Any]) -> AsyncInferenceConfig:
        """From `AWS::SageMaker::EndpointConfig` properties whose `AsyncInferenceConfig` values are resolved."""
        config = properties["AsyncInferenceConfig"]
        output = config["OutputConfig"]
        notification = output.get("NotificationConfig") or {}
        client = config.get("ClientConfig") or {}
        return cls(
            output_path=output["S3OutputPath"],
            failure_path=output.get("S3FailurePath"),
            success_topic=notification.get("SuccessTopic"),
            error_topic=notification.get("ErrorTopic"),
            max_concurrent_invocations=int(client.get("MaxConcurrentInvocationsPerInstance", 4)),
        )


@dataclass(frozen=True)
class Invocation:
    endpoint_name: str
    inference_id: str
    input_location: str
    output_location: str
    failure_location: str | None
    content_type: str | None
    accept: str | None
    custom_attributes: str | None
    received_at: str


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _s3(uri: str) -> tuple[str, str] | None:
    parsed = urlsplit(uri)
    key = parsed.path.lstrip("/")
    return (parsed.netloc, key) if parsed.scheme == "s3" and parsed.netloc else None


def _located(uri: str) -> tuple[str, str]:
    """Bucket and key of an S3 URI this module built or already checked."""
    where = _s3(uri)
    if where is None:
        raise ValueError(f"{uri!r} is not an s3://bucket/key URI")
    return where


class _InputUnreadable(Exception):
    """The input object's stream failed while it was being sent to the container (its cause says why)."""


def _chunks(body: Any) -> Iterator[bytes]:
    """The chunks of a botocore StreamingBody; a failure to read it is told apart from the container's."""
    try:
        yield from body.iter_chunks(CHUNK_BYTES)
    except Exception as error:  # botocore's ReadTimeoutError, IncompleteReadError...
        raise _InputUnreadable from error


def _download_failed(error: BaseException | None) -> str:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)
    return f"ClientError: Failed to download input data ({code})"


def _join(prefix: str, name: str) -> str:
    return prefix if prefix.endswith("/") and not name else f"{prefix.rstrip('/')}/{name}"


class AsyncInvocations:
    """SageMaker's asynchronous inference for one endpoint in front of one container."""

    def __init__(
        self,
        *,
        endpoint_name: str,
        container_url: str,
        config: AsyncInferenceConfig,
        s3: Any,
        sns: Any,
        http: httpx.Client | None = None,
        invocation_timeout_sec: float = INVOCATION_TIMEOUT_SEC,
    ) -> None:
        for what, uri in (("S3OutputPath", config.output_path), ("S3FailurePath", config.failure_path)):
            if uri is not None and _s3(uri) is None:
                raise ValueError(f"AsyncInvocations: {what}={uri!r} is not an s3://bucket/prefix/ URI")
        self.endpoint_name = endpoint_name
        self.container_url = container_url.rstrip("/")
        self.config = config
        self.s3 = s3
        self.sns = sns
        self.http = http or httpx.Client(timeout=httpx.Timeout(invocation_timeout_sec, connect=5.0))
        self._pool = ThreadPoolExecutor(config.max_concurrent_invocations, thread_name_prefix=f"async-{endpoint_name}")
        self._running: set[Future[None]] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
        self.http.close()

    def wait_idle(self, timeout_sec: float = 60.0) -> None:
        """Block until every accepted invocation has written its result and published its notification."""
        with self._lock:
            running = list(self._running)
        for future in running:
            future.result(timeout=timeout_sec)

    # ------------------------------------------------------------------------------------------ the API
    def handle(self, endpoint_name: str, request: Request) -> Reply:
        """`POST /endpoints/{endpoint_name}/async-invocations` as botocore sends it."""
        if endpoint_name != self.endpoint_name:
            return sagemaker_error(400, "ValidationError", f"Endpoint {endpoint_name} not found.")
        location = request.header("x-amzn-sagemaker-inputlocation")
        where = _s3(location or "")
        if location is None or where is None or not where[1]:
            return sagemaker_error(
                400, "ValidationError", "InputLocation: an S3 URI (s3://bucket/key) of the request payload is required"
            )
        inference_id = request.header("x-amzn-sagemaker-inference-id")
        if inference_id is not None and not 1 <= len(inference_id) <= 64:
            return sagemaker_error(400, "ValidationError", "InferenceId: must have length between 1 and 64")
        accepted = self.invoke(
            input_location=location,
            content_type=request.header("x-amzn-sagemaker-content-type"),
            accept=request.header("x-amzn-sagemaker-accept"),
            inference_id=inference_id,
            custom_attributes=request.header("x-amzn-sagemaker-custom-attributes"),
        )
        headers = {
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-OutputLocation": accepted.output_location,
            "x-amzn-RequestId": request_id(),
        }
        if accepted.failure_location:
            headers["X-Amzn-SageMaker-FailureLocation"] = accepted.failure_location
        return Reply(202, headers, json.dumps({"InferenceId": accepted.inference_id}).encode())

    def invoke(
        self,
        *,
        input_location: str,
        content_type: str | None = None,
        accept: str | None = None,
        inference_id: str | None = None,
        custom_attributes: str | None = None,
    ) -> Invocation:
        """Accept an invocation and run it in the background; the answer says where its outcome will be."""
        name = str(uuid.uuid4())
        invocation = Invocation(
            endpoint_name=self.endpoint_name,
            inference_id=inference_id or str(uuid.uuid4()),
            input_location=input_location,
            output_location=_join(self.config.output_path, f"{name}.out"),
            failure_location=_join(self.config.failure_path, f"{name}-error.out") if self.config.failure_path else None,
            content_type=content_type,
            accept=accept,
            custom_attributes=custom_attributes,
            received_at=_now(),
        )
        future = self._pool.submit(self._run, invocation)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._done)
        return invocation

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._running.discard(future)
        if future.exception() is not None:
            logger.error("async invocation failed to complete", exc_info=future.exception())

    # ------------------------------------------------------------------------------------------ the work
    def _run(self, invocation: Invocation) -> None:
        bucket, key = _located(invocation.input_location)
        try:
            found = self.s3.get_object(Bucket=bucket, Key=key)
        except Exception as error:  # botocore's NoSuchKey, AccessDenied...: SageMaker cannot read the input
            self._fail(invocation, _download_failed(error), None, None)
            return
        headers = {
            name: value
            for name, value in (
                ("Content-Type", invocation.content_type),
                ("Accept", invocation.accept),
                ("X-Amzn-SageMaker-Custom-Attributes", invocation.custom_attributes),
            )
            if value
        }
        # A declared length: the container sees a plain body (no chunked transfer encoding), streamed from S3
        # to the container in chunks, so that a 1 GB input never sits whole in this process.
        headers["Content-Length"] = str(found["ContentLength"])
        source = found["Body"]
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as answer:
            try:
                with self.http.stream(
                    "POST", f"{self.container_url}/invocations", content=_chunks(source), headers=headers
                ) as response:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        answer.write(chunk)
            except _InputUnreadable as unreadable:  # the object's stream broke off half-way
                self._fail(invocation, _download_failed(unreadable.__cause__), None, None)
                return
            except httpx.HTTPError as error:
                reason = f"ServerError: the model container did not answer ({type(error).__name__})"
                self._fail(invocation, reason, None, None)
                return
            finally:
                source.close()
            answer.seek(0)
            if response.status_code >= 400:
                kind = "client" if response.status_code < 500 else "server"
                reason = (
                    f"ClientError: Received {kind} error ({response.status_code}) from model. See the SageMaker "
                    "Endpoint logs in your account for more information."
                )
                self._fail(invocation, reason, answer, response.headers.get("content-type"))
                return
            content_type = response.headers.get("content-type", "application/octet-stream")
            self._store(invocation.output_location, answer, content_type)
        self._publish(
            self.config.success_topic,
            self._notification(invocation, "Completed")
            | {"responseParameters": {"contentType": content_type, "outputLocation": invocation.output_location}},
        )

    def _fail(self, invocation: Invocation, reason: str, body: IO[bytes] | None, content_type: str | None) -> None:
        if body is not None and invocation.failure_location is not None:
            self._store(invocation.failure_location, body, content_type or "application/json")
        self._publish(self.config.error_topic, self._notification(invocation, "Failed") | {"failureReason": reason})

    def _store(self, location: str, body: IO[bytes], content_type: str) -> None:
        """The container's answer, spooled to a file past SPOOL_BYTES, written to S3 from there: in one
        PutObject below the multipart threshold, in parts above it (CreateMultipartUpload, UploadPart and
        CompleteMultipartUpload, each of them s3:PutObject to IAM), never whole in memory."""
        from boto3.s3.transfer import TransferConfig

        bucket, key = _located(location)
        # One part at a time, in this invocation's thread: parts uploaded at once would each be held in memory.
        config = TransferConfig(
            multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=1, use_threads=False
        )
        self.s3.upload_fileobj(body, bucket, key, ExtraArgs={"ContentType": content_type}, Config=config)

    def _notification(self, invocation: Invocation, status: str) -> dict[str, Any]:
        request = {
            "endpointName": invocation.endpoint_name,
            "inputLocation": invocation.input_location,
            **({"contentType": invocation.content_type} if invocation.content_type else {}),
            **({"accept": invocation.accept} if invocation.accept else {}),
            **({"customAttributes": invocation.custom_attributes} if invocation.custom_attributes else {}),
        }
        return {
            "awsRegion": REGION,
            "eventTime": _now(),
            "receivedTime": invocation.received_at,
            "invocationStatus": status,
            "requestParameters": request,
            "inferenceId": invocation.inference_id,
            "eventVersion": "1.0",
            "eventSource": "aws:sagemaker",
            "eventName": "InferenceResult",
        }

    def _publish(self, topic: str | None, notification: dict[str, Any]) -> None:
        if topic:  # no topic configured: SageMaker sends no notification
            self.sns.publish(TopicArn=topic, Message=json.dumps(notification))
