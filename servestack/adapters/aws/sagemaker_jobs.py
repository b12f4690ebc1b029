"""Async jobs on a SageMaker async endpoint (`backend: sagemaker`): what servestack/adapters/asynchronous.py runs when
`SERVESTACK_ASYNC_BACKEND=sagemaker`.

Submit, uploads and status are the Lambda backend's (servestack/adapters/aws/jobs.py: the payload goes to S3, the job
record is `queued`), with one difference: instead of a queue message for the Lambda worker, the job goes to
SageMaker with `InvokeEndpointAsync(InputLocation=s3://<bucket>/<payload key>, InferenceId=<job id>)`.
SageMaker writes the answer under the endpoint's `S3OutputPath` (or the container's error under
`S3FailurePath`) and publishes a notification to its success or error SNS topic. Both topics feed a queue of
their own, whose function (`notification_handler`) records the outcome with `NotificationRecorder`:

    success: {"invocationStatus": "Completed", "inferenceId": "<job id>", "eventName": "InferenceResult",
              "responseParameters": {"contentType": "...", "outputLocation": "s3://<bucket>/<key>"}, ...}
    error:   {"invocationStatus": "Failed", "inferenceId": "<job id>", "failureReason": "ClientError: Received
              client error (400) from model. See the SageMaker Endpoint logs ...", ...}

(the fields SageMaker documents for Asynchronous Inference notifications; `requestParameters`, `eventTime`,
`awsRegion` and `eventSource: aws:sagemaker` come with them). A success marks the job `succeeded` with the
output object as its result; an error marks it `failed` with the container's own error (the JSON body it
answered, which SageMaker stored at the failure location) or, without one, SageMaker's `failureReason`. So
`GET /jobs/{id}` answers exactly as for the Lambda backend. Both writes are conditional: a notification
delivered twice changes nothing, and nothing overwrites `succeeded`.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from decimal import Decimal
from typing import Any, Literal

import boto3
from botocore.exceptions import ClientError

from servestack.adapters.aws.clients import aws_client
from servestack.adapters.aws.job_records import FAILED, SUCCEEDED, AsyncSettings, _conditional_failed, _now
from servestack.adapters.aws.jobs import JobService
from servestack.inference.errors import InternalError, InvalidInput
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import EnvironmentSettings

logger = logging.getLogger("servestack.sagemaker_jobs")
# The container's error body, when SageMaker stored one, is read up to this size (it is a small JSON object).
MAX_FAILURE_BODY_BYTES = 64 * 1024


class BackendSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """Which backend runs the jobs (`SERVESTACK_ASYNC_BACKEND`), and for SageMaker its endpoint and failure prefix."""

    async_backend: Literal["lambda", "sagemaker"] = "lambda"
    endpoint_name: str = ""
    failure_prefix: str = ""


def s3_location(uri: str) -> tuple[str, str] | None:
    parsed = urllib.parse.urlsplit(uri)
    key = parsed.path.lstrip("/")
    return (parsed.netloc, key) if parsed.scheme == "s3" and parsed.netloc and key else None


class SageMakerJobService(JobService):
    """`JobService` whose jobs run on a SageMaker async endpoint instead of the Lambda worker."""

    def __init__(
        self, settings: AsyncSettings, repository: ModelRepository, model: ServedModel, *, endpoint_name: str
    ) -> None:
        super().__init__(settings, repository, model)
        self.endpoint_name = endpoint_name
        self.runtime = aws_client("sagemaker-runtime")

    def enqueue(
        self, job_id: str, key: str, record: dict[str, Any] | None = None, *, payload: bytes | None = None
    ) -> None:
        """Hand the stored payload to SageMaker: called by submit before it writes the job's `record` (which
        then carries where SageMaker will write), and by confirm for an upload already recorded."""
        job = record if record is not None else self.get(job_id)
        try:
            response = self.runtime.invoke_endpoint_async(
                EndpointName=self.endpoint_name,
                InputLocation=f"s3://{self.settings.bucket}/{key}",
                InferenceId=job_id,
                ContentType=job["content_type"],
                Accept=job["accept"],
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "ClientError")
            logger.error("InvokeEndpointAsync refused job %s: %s", job_id, error)
            raise InternalError(
                f"the SageMaker endpoint {self.endpoint_name} did not take the job ({code}); see the submit log"
            ) from None
        locations = {
            "output_location": response.get("OutputLocation"),
            "failure_location": response.get("FailureLocation"),
        }
        known = {name: value for name, value in locations.items() if value}
        if record is not None:
            record.update(known)  # submit writes the record next, with these in it
        elif known:
            # Only where SageMaker will write: the status is the notification's to set, and may already be.
            self.table.update_item(
                Key={"job_id": job_id},
                UpdateExpression="SET " + ", ".join(f"{name} = :{name}" for name in known),
                ConditionExpression="attribute_exists(job_id)",
                ExpressionAttributeValues={f":{name}": value for name, value in known.items()},
            )


class JobNotYetRecorded(Exception):
    """A notification for a job whose record submit has not written yet: retried by SQS."""


class NotificationRecorder:
    """Records SageMaker's success and error notifications in the job table (no model needed)."""

    def __init__(self, settings: AsyncSettings, failure_prefix: str, *, s3: Any = None, table: Any = None) -> None:
        self.settings = settings
        self.failure_prefix = failure_prefix
        self.s3 = s3 or aws_client("s3")
        self.table = table or boto3.resource("dynamodb").Table(settings.jobs_table)

    def record(self, body: str) -> None:
        """One queue message: SageMaker's notification (raw SNS delivery), or an SNS envelope around one."""
        message = parse_notification(body)
        job_id, status = str(message["inferenceId"]), message["invocationStatus"]
        if status == "Completed":
            self._succeeded(job_id, message)
        elif status == "Failed":
            self._failed(job_id, message)
        else:
            raise InvalidInput(
                "notification: unknown invocationStatus",
                field="invocationStatus",
                value=status,
                allowed="Completed, Failed",
            )

    def _succeeded(self, job_id: str, message: dict[str, Any]) -> None:
        response = message.get("responseParameters") or {}
        where = s3_location(str(response.get("outputLocation", "")))
        if where is None or where[0] != self.settings.bucket or not where[1].startswith(self.settings.result_prefix):
            reason = {
                "type": "InternalError",
                "message": f"SageMaker wrote the result outside this deployment: {response.get('outputLocation')!r}",
            }
            self._update(job_id, FAILED, {"error": reason})
            return
        self._update(
            job_id,
            SUCCEEDED,
            {"result_key": where[1], "result_type": str(response.get("contentType") or "application/json")},
        )

    def _failed(self, job_id: str, message: dict[str, Any]) -> None:
        reason = self._container_error(job_id, message) or {
            "type": "InferenceFailed",
            "message": str(message.get("failureReason") or "SageMaker reported a failure without a reason"),
        }
        self._update(job_id, FAILED, {"error": reason})

    def _container_error(self, job_id: str, message: dict[str, Any]) -> dict[str, Any] | None:
        """The container's own `{"error": {...}}`, from where SageMaker stored the failed answer."""
        location = (message.get("responseParameters") or {}).get("failureLocation")
        if not location:
            item = self.table.get_item(Key={"job_id": job_id}, ConsistentRead=True).get("Item") or {}
            location = item.get("failure_location")
        where = s3_location(str(location or ""))
        if where is None or where[0] != self.settings.bucket or not where[1].startswith(self.failure_prefix):
            return None
        try:
            response = self.s3.get_object(Bucket=where[0], Key=where[1], Range=f"bytes=0-{MAX_FAILURE_BODY_BYTES - 1}")
            error = json.loads(response["Body"].read()).get("error")
        except (ClientError, ValueError, AttributeError):
            return None
        return error if isinstance(error, dict) and "type" in error and "message" in error else None

    def _update(self, job_id: str, status: str, fields: dict[str, Any]) -> None:
        names = {"#s": "status", **{f"#{name}": name for name in fields}}
        values = {
            ":status": status,
            ":succeeded": SUCCEEDED,
            ":now": _now(),
            **{
                f":{name}": json.loads(json.dumps(value, default=str), parse_float=Decimal)
                for name, value in fields.items()
            },
        }
        try:
            self.table.update_item(
                Key={"job_id": job_id},
                UpdateExpression="SET #s = :status, updated_at = :now, "
                + ", ".join(f"#{name} = :{name}" for name in fields),
                ConditionExpression="attribute_exists(job_id) AND #s <> :succeeded",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise
            if self.table.get_item(Key={"job_id": job_id}, ConsistentRead=True).get("Item") is None:
                # SageMaker answered before submit wrote the record (it invokes first, then records): fail this
                # message so SQS delivers it again once the record exists.
                raise JobNotYetRecorded(
                    f"job {job_id}: no record yet; the notification will be delivered again"
                ) from None
            logger.info("notification for job %s ignored: it already succeeded", job_id)


def parse_notification(body: str) -> dict[str, Any]:
    """SageMaker's notification object; `InvalidInput` for anything else (the message then goes to the DLQ)."""
    try:
        message = json.loads(body)
        if isinstance(message, dict) and message.get("Type") == "Notification" and "Message" in message:
            message = json.loads(message["Message"])  # an SNS envelope: the subscription has no raw delivery
    except (ValueError, TypeError):
        raise InvalidInput("notification: body is not JSON", field="body", allowed="a SageMaker notification") from None
    if not isinstance(message, dict) or "inferenceId" not in message or "invocationStatus" not in message:
        raise InvalidInput(
            "notification: not a SageMaker Asynchronous Inference notification",
            field="body",
            value=body[:80],
            allowed='{"inferenceId", "invocationStatus", ...}',
        )
    return message
