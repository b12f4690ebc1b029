"""Async mode on Lambda: `submit_handler` (HTTP API: submit + status) and `worker_handler` (SQS batches).

Routes (API Gateway HTTP API v2 events):
- `POST /jobs`: the body is the payload (JSON, CSV or .npy, up to the presign threshold): 202 + job id.
- `POST /jobs/uploads`: a presigned S3 PUT URL for a payload up to 1 GB; the job starts when the object
  lands (S3 notification on the upload prefix) or on `POST /jobs/{id}/confirm`.
- `GET /jobs/{id}`: `queued | running | succeeded | failed`, the result location and a presigned GET URL, or
  the error.
The worker reports partial batch failures with Powertools' `BatchProcessor`; see handlers/aws/jobs.py for the
idempotency and retry rules.

With `SERVESTACK_ASYNC_BACKEND=sagemaker` a SageMaker async endpoint runs the jobs instead of the worker: submit
calls `InvokeEndpointAsync`, and `notification_handler` records SageMaker's success and error notifications,
which reach it through a queue of their own (handlers/aws/sagemaker_jobs.py).
"""

from __future__ import annotations

import base64
import functools
import os
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from handlers.aws.jobs import AsyncSettings, JobService
from handlers.aws.sagemaker_jobs import BackendSettings, NotificationRecorder, SageMakerJobService
from models.errors import ServingError
from models.service import ModelRepository
from models.settings import ServingSettings

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


@api.post("/jobs")
def submit() -> Response[Any]:
    event = api.current_event
    raw = event.body or ""
    body = base64.b64decode(raw) if event.is_base64_encoded else raw.encode()
    job = service().submit(body, event.headers.get("content-type"), event.headers.get("accept"))
    return _json(202, {"job_id": job["job_id"], "status": job["status"], "status_url": _status_url(job["job_id"])})


@api.post("/jobs/uploads")
def create_upload() -> Response[Any]:
    request = api.current_event.json_body if api.current_event.body else {}
    job, url = service().create_upload(request.get("content_type"), request.get("accept"))
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
    jobs = service()
    outcomes = jobs.prepare(event["Records"])

    def record_handler(record: SQSRecord) -> None:
        jobs.finish(outcomes[record.message_id], int(record.attributes.approximate_receive_count))

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
