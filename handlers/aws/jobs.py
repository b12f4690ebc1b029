"""Async jobs on S3 + SQS + DynamoDB: what `handlers/asynchronous.py` calls.

A job's life: `queued` (submit wrote the payload and the record, then enqueued a pointer) -> `running` (a
worker claimed it) -> `succeeded` (result object written, then the record) or `failed` (with a reason).
Every transition is a conditional write, so redelivered or duplicated messages are harmless:
- a claim succeeds only from `queued` or `running` (a worker that crashed mid-job leaves `running`);
- the result is written with `If-None-Match: *`, so a job has exactly one result object whatever happens;
- `succeeded` is final: nothing overwrites it, and a message for a succeeded job is simply acknowledged;
- `failed` is final too: a message for a failed job fails fast, so SQS moves it to the DLQ after
  `maxReceiveCount` receives.
Non-retryable errors (the caller's payload is bad) mark the job `failed` at once; retryable ones are left
for SQS to redeliver, and mark it `failed` only on the last receive.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

import boto3
import msgspec
from botocore.exceptions import ClientError

from handlers.aws.clients import aws_client
from models import codecs
from models.errors import (
    InvalidInput,
    JobFailed,
    JobNotFound,
    PayloadTooLarge,
    ServingError,
)
from models.grouping import predict_grouped
from models.runtime import Arrays
from models.service import ModelRepository, ServedModel
from models.settings import EnvironmentSettings

ONE_GIBIBYTE = 1024**3
QUEUED, RUNNING, SUCCEEDED, FAILED = "queued", "running", "succeeded", "failed"


class AsyncSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """The async deployment's resources (`SERVESTACK_*`); the CDK construct (stacks/asynchronous.py) sets the
    same variables."""

    bucket: str
    request_prefix: str
    result_prefix: str
    queue_url: str
    jobs_table: str
    result_ttl_days: Annotated[int, msgspec.Meta(ge=1)] = 7
    presign_threshold_bytes: Annotated[int, msgspec.Meta(ge=1)] = 262_144
    max_upload_bytes: Annotated[int, msgspec.Meta(ge=1)] = ONE_GIBIBYTE
    max_receive_count: Annotated[int, msgspec.Meta(ge=1)] = 3
    presign_expiry_sec: Annotated[int, msgspec.Meta(ge=1, le=604_800)] = 3600

    @property
    def upload_prefix(self) -> str:
        """Large payloads land here through a presigned PUT; an S3 notification on it starts the job."""
        return f"{self.request_prefix}uploads/"


@dataclass(frozen=True)
class JobRef:
    """What a queue message says: which job, and where its payload is."""

    job_id: str
    bucket: str
    key: str


def parse_message(body: str) -> JobRef | None:
    """Our own `{"job_id", "bucket", "key"}` message, or an S3 ObjectCreated notification for an upload.

    None for messages that need no work (S3's `s3:TestEvent`); `InvalidInput` for anything else.
    """
    try:
        message = json.loads(body)
    except ValueError:
        raise InvalidInput("queue message: body is not JSON", field="body", allowed="a job message") from None
    if isinstance(message, dict) and message.get("Event") == "s3:TestEvent":
        return None
    if isinstance(message, dict) and {"job_id", "bucket", "key"} <= message.keys():
        return JobRef(str(message["job_id"]), str(message["bucket"]), str(message["key"]))
    records = message.get("Records") if isinstance(message, dict) else None
    if isinstance(records, list) and records and isinstance(records[0], dict) and "s3" in records[0]:
        s3 = records[0]["s3"]
        key = urllib.parse.unquote_plus(s3["object"]["key"])
        return JobRef(key.rsplit("/", 1)[-1], s3["bucket"]["name"], key)
    raise InvalidInput(
        "queue message: not a job message",
        field="body",
        value=body[:80],
        allowed='{"job_id", "bucket", "key"} or an S3 ObjectCreated notification',
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _conditional_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") in ("ConditionalCheckFailedException", "PreconditionFailed")


@dataclass
class Outcome:
    """A record's fate after the claim/read/decode/predict pass, before its result is written."""

    ref: JobRef | None = None
    job: dict[str, Any] = field(default_factory=dict)
    arrays: Arrays | None = None
    outputs: Arrays | None = None
    error: Exception | None = None
    skip: bool = False


class JobService:
    """Submit, status and work for one async deployment."""

    def __init__(self, settings: AsyncSettings, repository: ModelRepository, model: ServedModel) -> None:
        self.settings = settings
        self.repository = repository
        self.model = model
        self.s3 = aws_client("s3")
        self.sqs = aws_client("sqs")
        self.table = boto3.resource("dynamodb").Table(settings.jobs_table)

    # ----------------------------------------------------------------------------------------- submit

    def submit(self, body: bytes, content_type: str | None, accept: str | None) -> dict[str, Any]:
        """Store an inline payload, record the job `queued`, enqueue it. Returns the job record."""
        limit = self.settings.presign_threshold_bytes
        if len(body) > limit:
            raise PayloadTooLarge(
                f"inline payload of {len(body)} bytes is over {limit}: POST /jobs/uploads for a presigned "
                f"upload URL (up to {self.settings.max_upload_bytes} bytes)",
                field="body",
                value=len(body),
                allowed=f"<= {limit} bytes inline",
            )
        media_type = codecs.media_type_of(content_type)
        if media_type not in codecs.READABLE_TYPES:
            codecs.decode_body(b"", media_type)  # raises UnsupportedMediaType naming the allowed types
        codecs.negotiate(accept)
        job_id = uuid.uuid4().hex
        key = f"{self.settings.request_prefix}{job_id}"
        self.s3.put_object(Bucket=self.settings.bucket, Key=key, Body=body, ContentType=media_type)
        job = self._record(job_id, key, media_type, accept, len(body))
        self.enqueue(job_id, key)
        return job

    def create_upload(self, content_type: str | None, accept: str | None) -> tuple[dict[str, Any], str]:
        """Record a job whose payload the caller PUTs to S3; it starts on the S3 event or on confirm."""
        media_type = codecs.media_type_of(content_type)
        if media_type not in codecs.READABLE_TYPES:
            codecs.decode_body(b"", media_type)
        codecs.negotiate(accept)
        job_id = uuid.uuid4().hex
        key = f"{self.settings.upload_prefix}{job_id}"
        job = self._record(job_id, key, media_type, accept, None)
        url = self.s3.generate_presigned_url(
            "put_object",
            Params={"Bucket": self.settings.bucket, "Key": key, "ContentType": media_type},
            ExpiresIn=self.settings.presign_expiry_sec,
        )
        return job, str(url)

    def confirm(self, job_id: str) -> dict[str, Any]:
        """Start an uploaded job now (the S3 notification does the same; duplicates are harmless)."""
        job = self.get(job_id)
        try:
            self.s3.head_object(Bucket=self.settings.bucket, Key=job["input_key"])
        except ClientError:
            raise InvalidInput(
                f"job {job_id}: nothing uploaded yet", field="upload", allowed="PUT the payload to upload_url first"
            ) from None
        if job["status"] == QUEUED:
            self.enqueue(job_id, job["input_key"])
        return job

    def _record(self, job_id: str, key: str, media_type: str, accept: str | None, size: int | None) -> dict[str, Any]:
        now = _now()
        job: dict[str, Any] = {
            "job_id": job_id,
            "status": QUEUED,
            "model": self.model.manifest.key,
            "input_key": key,
            "content_type": media_type,
            "accept": codecs.negotiate(accept),
            "created_at": now,
            "updated_at": now,
            "attempts": 0,
            "expires_at": int(time.time()) + self.settings.result_ttl_days * 86_400,
        }
        if size is not None:
            job["input_bytes"] = size
        self.table.put_item(Item=job, ConditionExpression="attribute_not_exists(job_id)")
        return job

    def enqueue(self, job_id: str, key: str) -> None:
        body = json.dumps({"job_id": job_id, "bucket": self.settings.bucket, "key": key})
        self.sqs.send_message(QueueUrl=self.settings.queue_url, MessageBody=body)

    # ----------------------------------------------------------------------------------------- status

    def get(self, job_id: str) -> dict[str, Any]:
        item = self.table.get_item(Key={"job_id": job_id}, ConsistentRead=True).get("Item")
        if item is None:
            raise JobNotFound(f"job {job_id!r} does not exist (or has expired)", field="job_id", value=job_id)
        return {k: (int(v) if k in ("attempts", "expires_at", "input_bytes") else v) for k, v in item.items()}

    def status(self, job_id: str) -> dict[str, Any]:
        """The job as a caller sees it: status, and the result location + a presigned GET, or the error."""
        job = self.get(job_id)
        view: dict[str, Any] = {
            k: job[k] for k in ("job_id", "status", "model", "created_at", "updated_at", "attempts") if k in job
        }
        if job["status"] == SUCCEEDED:
            key = job["result_key"]
            view["result"] = {
                "location": f"s3://{self.settings.bucket}/{key}",
                "content_type": job.get("result_type", codecs.JSON),
                "url": self.s3.generate_presigned_url(
                    "get_object",
                    Params={"Bucket": self.settings.bucket, "Key": key},
                    ExpiresIn=self.settings.presign_expiry_sec,
                ),
            }
        if job["status"] == FAILED:
            view["error"] = job.get("error")
        return view

    # ----------------------------------------------------------------------------------------- worker

    def prepare(self, records: list[dict[str, Any]]) -> dict[str, Outcome]:
        """Claim, read and decode every record, then predict them together where shapes allow."""
        outcomes: dict[str, Outcome] = {}
        for record in records:
            outcome = Outcome()
            outcomes[record["messageId"]] = outcome
            try:
                outcome.ref = parse_message(record["body"])
                if outcome.ref is None:
                    outcome.skip = True
                    continue
                receives = int(record.get("attributes", {}).get("ApproximateReceiveCount", "1"))
                claimed = self._claim(outcome.ref.job_id, receives)
                if claimed is None:
                    outcome.skip = True
                    continue
                outcome.job = claimed
                outcome.arrays = self.model.decode(self._read(outcome.ref), claimed["content_type"])
            except Exception as error:  # recorded, then raised for this record alone by `finish`
                outcome.error = error
        ready = [o for o in outcomes.values() if o.arrays is not None and o.error is None]
        for outcome, result in zip(
            ready, predict_grouped(self.model, [o.arrays for o in ready if o.arrays]), strict=True
        ):
            if isinstance(result, ServingError):
                outcome.error = result
            else:
                outcome.outputs = result
        return outcomes

    def finish(self, outcome: Outcome, receives: int) -> None:
        """Write the result and mark the job `succeeded`, or record the failure and raise it."""
        if outcome.skip:
            return
        try:
            if outcome.error is not None:
                raise outcome.error
            assert outcome.ref is not None
            assert outcome.outputs is not None
            self._write_result(outcome.ref.job_id, outcome.job, outcome.outputs)
        except ServingError as error:
            last = receives >= self.settings.max_receive_count
            if outcome.ref is not None and not isinstance(error, JobFailed | JobNotFound):
                if not error.retryable:
                    self._fail(outcome.ref.job_id, error.to_dict())
                elif last:
                    reason = error.to_dict() | {"message": f"gave up after {receives} receives: {error.message}"}
                    self._fail(outcome.ref.job_id, reason)
            raise
        except Exception as error:
            if outcome.ref is not None and receives >= self.settings.max_receive_count:
                reason = {"type": type(error).__name__, "message": f"gave up after {receives} receives: {error}"}
                self._fail(outcome.ref.job_id, reason)
            raise

    def _claim(self, job_id: str, receives: int) -> dict[str, Any] | None:
        """Move the job to `running`; None when it already succeeded (nothing left to do)."""
        try:
            attributes = self.table.update_item(
                Key={"job_id": job_id},
                UpdateExpression="SET #s = :running, attempts = if_not_exists(attempts, :zero) + :one, "
                "receives = :receives, updated_at = :now",
                ConditionExpression="attribute_exists(job_id) AND (#s = :queued OR #s = :running)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={
                    ":running": RUNNING,
                    ":queued": QUEUED,
                    ":zero": 0,
                    ":one": 1,
                    ":receives": receives,
                    ":now": _now(),
                },
                ReturnValues="ALL_NEW",
            )["Attributes"]
        except ClientError as error:
            if not _conditional_failed(error):
                raise
            job = self.get(job_id)  # raises JobNotFound when there is no record at all
            if job["status"] == SUCCEEDED:
                return None
            reason = job.get("error") or {}
            raise JobFailed(f"job {job_id} already failed: {reason.get('message', 'unknown reason')}") from None
        return dict(attributes)

    def _read(self, ref: JobRef) -> bytes:
        if ref.bucket != self.settings.bucket or not ref.key.startswith(self.settings.request_prefix):
            raise InvalidInput(
                f"job {ref.job_id}: payload s3://{ref.bucket}/{ref.key} is outside this deployment",
                field="key",
                allowed=f"s3://{self.settings.bucket}/{self.settings.request_prefix}...",
            )
        response = self.s3.get_object(Bucket=ref.bucket, Key=ref.key)
        size = int(response["ContentLength"])
        limit = self.settings.max_upload_bytes
        if size > limit:
            response["Body"].close()
            raise PayloadTooLarge(f"payload of {size} bytes", field="body", value=size, allowed=f"<= {limit} bytes")
        chunks = list(response["Body"].iter_chunks(1024 * 1024))
        return b"".join(chunks)

    def _write_result(self, job_id: str, job: dict[str, Any], outputs: Arrays) -> None:
        encoded = codecs.encode_response(self.model.respond(outputs), job.get("accept") or codecs.JSON)
        key = f"{self.settings.result_prefix}{job_id}"
        try:
            self.s3.put_object(
                Bucket=self.settings.bucket, Key=key, Body=encoded.body, ContentType=encoded.media_type, IfNoneMatch="*"
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise
            # An earlier delivery wrote it and crashed before recording success: the result stands.
        try:
            self.table.update_item(
                Key={"job_id": job_id},
                UpdateExpression="SET #s = :succeeded, result_key = :key, result_type = :type, updated_at = :now",
                ConditionExpression="#s <> :succeeded",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={
                    ":succeeded": SUCCEEDED,
                    ":key": key,
                    ":type": encoded.media_type,
                    ":now": _now(),
                },
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise

    def _fail(self, job_id: str, reason: dict[str, Any]) -> None:
        """Record `failed` with a reason, never over a success."""
        try:
            self.table.update_item(
                Key={"job_id": job_id},
                UpdateExpression="SET #s = :failed, #e = :error, updated_at = :now",
                ConditionExpression="attribute_exists(job_id) AND #s <> :succeeded",
                ExpressionAttributeNames={"#s": "status", "#e": "error"},
                ExpressionAttributeValues={
                    ":failed": FAILED,
                    ":succeeded": SUCCEEDED,
                    ":error": json.loads(json.dumps(reason, default=str), parse_float=Decimal),
                    ":now": _now(),
                },
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise
