"""Async mode on Lambda: `submit_handler` (HTTP API: submit + status) and `worker_handler` (SQS batches).

Routes (API Gateway HTTP API v2 events):
- `POST /jobs`: the body is the payload (JSON, CSV or .npy, or for a model with a `preprocess` hook any body it
  reads, an image say; up to the presign threshold, optionally with `Content-Encoding: gzip`): 202 + job id.
  With an `Idempotency-Key` header, retries of the same request are the same job (`"replayed": true` on a
  repeat); the same key with another body, `Content-Type` or `Accept` is 422, and a retry while the first call
  is still submitting is 409 (servestack/adapters/aws/jobs.py).
- `POST /jobs/uploads`: a presigned S3 PUT URL for a payload up to 1 GB; the job starts when the object
  lands (S3 notification on the upload prefix) or on `POST /jobs/{id}/confirm`.
- `GET /jobs/{id}`: `queued | running | succeeded | failed`, the result location and a presigned GET URL, or
  the error.
The worker reports partial batch failures with Powertools' `BatchProcessor`; see servestack/adapters/aws/jobs.py for the
idempotency rules and servestack/adapters/aws/job_worker.py for the retry rules.

With `SERVESTACK_ASYNC_BACKEND=sagemaker` a SageMaker async endpoint runs the jobs instead of the worker: submit
calls `InvokeEndpointAsync`, and `notification_handler` records SageMaker's success and error notifications,
which reach it through a queue of their own (servestack/adapters/aws/sagemaker_jobs.py).
"""

from __future__ import annotations

import base64
import functools
import os
from typing import Any

import orjson
from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from servestack.adapters.aws.jobs import AsyncSettings, JobService
from servestack.adapters.aws.sagemaker_jobs import BackendSettings, NotificationRecorder, SageMakerJobService
from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings

logger = Logger(service="servestack")
api = APIGatewayHttpResolver()


@functools.cache
def service() -> JobService:
    """Built once per process (Lambda init): settings from the environment, models loaded and warmed."""
    repository = ModelRepository(ServingSettings.from_environment())
    repository.load_all()
    settings, backend = AsyncSettings.from_environment(), BackendSettings.from_environment()
    if backend.async_backend == "sagemaker":
        return SageMakerJobService(settings, repository, repository.get(), endpoint_name=backend.endpoint_name)
    return JobService(settings, repository, repository.get())


@functools.cache
def recorder() -> NotificationRecorder:
    """The SageMaker backend's notification recorder: no model to load, only the job table (and S3)."""
    backend = BackendSettings.from_environment()
    return NotificationRecorder(AsyncSettings.from_environment(), backend.failure_prefix)


def _json(status: int, body: dict[str, Any]) -> Response[Any]:
    return Response(status_code=status, content_type="application/json", body=body)


def _status_url(job_id: str) -> str:
    headers = api.current_event.headers
    host = headers.get("host") or api.current_event.request_context.domain_name
    return f"{headers.get('x-forwarded-proto', 'https')}://{host}/jobs/{job_id}"


def _serving_error(error: ServingError) -> Response[Any]:
    return _json(error.status_code, {"error": error.to_dict()})


api.exception_handler(ServingError)(_serving_error)
ROUTES = "POST /jobs, POST /jobs/uploads, POST /jobs/{id}/confirm, GET /jobs/{id}"


@api.not_found
def _not_found(_: Exception) -> Response[Any]:
    """An unknown route is the same JSON error shape as every other refusal."""
    event = api.current_event
    where = f"{event.request_context.http.method} {event.raw_path}"[:200]
    return _json(404, {"error": {"type": "NotFound", "message": f"{where}: no such route", "allowed": ROUTES}})


@api.post("/jobs")
def submit() -> Response[Any]:
    event = api.current_event
    raw = event.body or ""
    body = base64.b64decode(raw) if event.is_base64_encoded else raw.encode()
    headers = event.headers
    job = service().submit(
        body,
        headers.get("content-type"),
        headers.get("accept"),
        idempotency_key=headers.get("idempotency-key"),
        content_encoding=headers.get("content-encoding"),
    )
    answer = {"job_id": job["job_id"], "status": job["status"], "status_url": _status_url(job["job_id"])}
    if job.get("replayed"):
        answer["replayed"] = True
    return _json(202, answer)


def _json_request() -> dict[str, Any]:
    """The request's JSON object body ({} when empty); anything else is a 400, never a 500."""
    event = api.current_event
    if not event.body:
        return {}
    raw = base64.b64decode(event.body) if event.is_base64_encoded else event.body.encode()
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"body: malformed JSON ({exc})", field="body", allowed="a JSON object") from None
    if not isinstance(request, dict) or not all(
        isinstance(request.get(key), str | None) for key in ("content_type", "accept")
    ):
        raise InvalidInput(
            'body: expected {"content_type": ..., "accept": ...}',
            field="body",
            allowed='a JSON object with string "content_type" and "accept"',
        )
    return request


@api.post("/jobs/uploads")
def create_upload() -> Response[Any]:
    request = _json_request()
    job, url = service().create_upload(
        request.get("content_type"),
        request.get("accept"),
        idempotency_key=api.current_event.headers.get("idempotency-key"),
    )
    status_url = _status_url(job["job_id"])
    return _json(
        201,
        {
            "job_id": job["job_id"],
            "status": job["status"],
            "upload": {"url": url, "method": "PUT", "headers": {"Content-Type": job["content_type"]}},
            "max_bytes": service().settings.max_upload_bytes,
            "confirm_url": f"{status_url}/confirm",
            "status_url": status_url,
        },
    )


@api.post("/jobs/<job_id>/confirm")
def confirm(job_id: str) -> Response[Any]:
    job = service().confirm(job_id)
    return _json(202, {"job_id": job_id, "status": job["status"], "status_url": _status_url(job_id)})


@api.get("/jobs/<job_id>")
def status(job_id: str) -> Response[Any]:
    return _json(200, service().status(job_id))


if os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
    # Lambda's init phase (module import): load and warm the model before the first event, not during it.
    service()


@logger.inject_lambda_context(clear_state=True)
def submit_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return api.resolve(event, context)


@logger.inject_lambda_context(clear_state=True)
def worker_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    outcomes = service().work(event["Records"])

    def record_handler(record: SQSRecord) -> None:
        retry = outcomes[record.message_id].retry
        if retry is not None:
            raise retry  # reported in batchItemFailures: SQS delivers this record again

    processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    return dict(response)


@logger.inject_lambda_context(clear_state=True)
def notification_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """SQS batches of SageMaker's async notifications; a record that cannot be recorded is retried alone."""
    jobs = recorder()

    def record_handler(record: SQSRecord) -> None:
        jobs.record(record.body)

    processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    return dict(response)
