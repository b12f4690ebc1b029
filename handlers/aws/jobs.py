"""Async jobs on S3 + SQS + DynamoDB: what `handlers/asynchronous.py` calls.

A job's life: `queued` (submit stored the payload, enqueued the job, then recorded it) -> `running` (a
worker claimed it) -> `succeeded` (result object written, then the record) or `failed` (with a reason).
Every transition is a conditional write, so redelivered or duplicated messages are harmless:
- a claim succeeds only from `queued` or `running` (a worker that crashed mid-job leaves `running`);
- the result is written with `If-None-Match: *`, so a job has exactly one result object whatever happens;
- `succeeded` is final: nothing overwrites it, and a message for a succeeded job is simply acknowledged;
- `failed` is final too: a message for a failed job goes to the DLQ with the recorded reason.
Non-retryable errors (the caller's payload is bad) mark the job `failed` at once; retryable ones are left
for SQS to redeliver, and mark it `failed` only on the last receive.

Dead letters carry their reason. SQS's redrive moves a message to the DLQ unchanged, so the worker does it
itself for every message it gives up on: it records `failed` with the reason, sends the message body to the
DLQ with the reason in message attributes (`ErrorType`, `ErrorMessage`, `JobId`, `ReceiveCount`), and
reports the record handled. Only a worker that dies on a message's last receive leaves it to the redrive.

The queue, not the table, is where a job begins (an outbox in the queue). Submit stores the payload, sends
the message, then writes the record; the message carries the whole record, so a worker that finds no record
creates it as it claims the job. A crash between the send and the record write therefore never leaves a job
that nobody will run, and a crash before the send leaves no record at all: there is no `queued` job without
a message, and no sweep of the table is needed to find one. The caller retries such a failed submit with
the same `Idempotency-Key` (or SageMaker `InferenceId`): the key fixes the job id, so every retry is the same
job, and a retry with a different body under the same key is refused (422).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

import boto3
import msgspec
import orjson
from botocore.exceptions import ClientError

from handlers.aws.clients import aws_client
from models import codecs
from models.errors import (
    IdempotencyConflict,
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
# The record fields a job message carries, so that a worker can create the record a crashed submit never wrote.
RECORD_FIELDS = ("model", "input_key", "content_type", "accept", "created_at", "expires_at", "request_sha256")
# An Idempotency-Key: printable ASCII, at most 255 characters (SageMaker's InferenceId is 1..64 of them).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


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
    # Where the worker sends, with their reason, the messages it gives up on; empty: SQS's redrive does,
    # without a reason.
    dead_letter_queue_url: str = ""
    # What a `Content-Encoding: gzip` submit may inflate to.
    max_decoded_bytes: Annotated[int, msgspec.Meta(ge=1)] = 6 * 1024 * 1024

    @property
    def upload_prefix(self) -> str:
        """Large payloads land here through a presigned PUT; an S3 notification on it starts the job."""
        return f"{self.request_prefix}uploads/"


@dataclass(frozen=True)
class JobRef:
    """What a queue message says: which job, where its payload is, and (our own messages) its record."""

    job_id: str
    bucket: str
    key: str
    record: dict[str, Any] | None = None


def parse_message(body: str) -> JobRef | None:
    """Our own `{"job_id", "bucket", "key"[, "record"]}` message, or an S3 ObjectCreated notification for an
    upload. None for messages that need no work (S3's `s3:TestEvent`); `InvalidInput` for anything else."""
    try:
        message = orjson.loads(body)  # bounded nesting, unlike json.loads, whose RecursionError is no ServingError
    except orjson.JSONDecodeError:
        raise InvalidInput("queue message: body is not JSON", field="body", allowed="a job message") from None
    if isinstance(message, dict) and message.get("Event") == "s3:TestEvent":
        return None
    if isinstance(message, dict) and {"job_id", "bucket", "key"} <= message.keys():
        record = message.get("record")
        if isinstance(record, dict):
            record = {name: record[name] for name in RECORD_FIELDS if isinstance(record.get(name), str | int)}
        return JobRef(str(message["job_id"]), str(message["bucket"]), str(message["key"]), record if record else None)
    records = message.get("Records") if isinstance(message, dict) else None
    if isinstance(records, list) and records and isinstance(records[0], dict) and "s3" in records[0]:
        try:
            s3 = records[0]["s3"]
            key = urllib.parse.unquote_plus(str(s3["object"]["key"]))
            return JobRef(key.rsplit("/", 1)[-1], str(s3["bucket"]["name"]), key)
        except (KeyError, TypeError):
            pass
    raise InvalidInput(
        "queue message: not a job message",
        field="body",
        value=body[:80],
        allowed='{"job_id", "bucket", "key"} or an S3 ObjectCreated notification',
    )


def job_id_for(idempotency_key: str | None) -> str:
    """A new job id, or the one an idempotency key always names (so that every retry is the same job)."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    if not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
        raise InvalidInput(
            "Idempotency-Key: not a usable key",
            field="Idempotency-Key",
            value=idempotency_key[:80],
            allowed="1 to 255 printable ASCII characters, e.g. a UUID",
        )
    return hashlib.sha256(b"servestack-job:" + idempotency_key.encode()).hexdigest()[:32]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _conditional_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") in ("ConditionalCheckFailedException", "PreconditionFailed")


@dataclass
class Outcome:
    """A record's fate after the claim/read/decode/predict pass, before its result is written."""

    body: str = ""
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

    def submit(
        self,
        body: bytes,
        content_type: str | None,
        accept: str | None,
        *,
        idempotency_key: str | None = None,
        content_encoding: str | None = None,
    ) -> dict[str, Any]:
        """Store an inline payload, enqueue the job, record it `queued`. Returns the job record (the existing
        one when `idempotency_key` names a job already submitted with the same body)."""
        limit = self.settings.presign_threshold_bytes
        if len(body) > limit:
            raise PayloadTooLarge(
                f"inline payload of {len(body)} bytes is over {limit}: POST /jobs/uploads for a presigned "
                f"upload URL (up to {self.settings.max_upload_bytes} bytes)",
                field="body",
                value=len(body),
                allowed=f"<= {limit} bytes inline",
            )
        media_type = self._check_types(content_type, accept)
        body = codecs.decode_content(body, content_encoding, self.settings.max_decoded_bytes)
        digest = hashlib.sha256(body).hexdigest()
        job_id = job_id_for(idempotency_key)
        if idempotency_key is not None:
            existing = self._existing(job_id, digest)
            if existing is not None:
                return existing
        key = f"{self.settings.request_prefix}{job_id}"
        if idempotency_key is not None:
            key += f"-{digest[:16]}"  # a retry with other bytes under the same key never overwrites the payload
        self.s3.put_object(Bucket=self.settings.bucket, Key=key, Body=body, ContentType=media_type)
        job = self._new_record(job_id, key, media_type, accept, len(body), digest)
        self.enqueue(job_id, key, job)  # first: once the message exists, the job will run (see the module doc)
        return self._record(job, digest)

    def _check_types(self, content_type: str | None, accept: str | None) -> str:
        media_type = codecs.media_type_of(content_type)
        if media_type not in codecs.READABLE_TYPES:
            codecs.decode_body(b"", media_type)  # raises UnsupportedMediaType naming the allowed types
        codecs.negotiate(accept)
        return media_type

    def _existing(self, job_id: str, digest: str | None) -> dict[str, Any] | None:
        """The job an idempotency key already made, or None; a different body under the key is refused."""
        try:
            job = self.get(job_id)
        except JobNotFound:
            return None
        recorded = job.get("request_sha256")
        if digest is not None and recorded is not None and recorded != digest:
            raise IdempotencyConflict(
                "Idempotency-Key: this key was used for a different request body",
                field="Idempotency-Key",
                value=job_id,
                allowed="a new key for a new request; the same key only to retry the same request",
            )
        job["replayed"] = True
        return job

    def create_upload(
        self, content_type: str | None, accept: str | None, *, idempotency_key: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """Record a job whose payload the caller PUTs to S3; it starts on the S3 event or on confirm."""
        media_type = self._check_types(content_type, accept)
        job_id = job_id_for(idempotency_key)
        existing = self._existing(job_id, None) if idempotency_key is not None else None
        if existing is not None:
            job = existing
        else:
            key = f"{self.settings.upload_prefix}{job_id}"
            job = self._record(self._new_record(job_id, key, media_type, accept, None, None), None)
        url = self.s3.generate_presigned_url(
            "put_object",
            Params={"Bucket": self.settings.bucket, "Key": job["input_key"], "ContentType": job["content_type"]},
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
            self.enqueue(job_id, job["input_key"], job)
        return job

    def _new_record(
        self, job_id: str, key: str, media_type: str, accept: str | None, size: int | None, digest: str | None
    ) -> dict[str, Any]:
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
        if digest is not None:
            job["request_sha256"] = digest
        return job

    def _record(self, job: dict[str, Any], digest: str | None) -> dict[str, Any]:
        """Write the new record; when it is there already (a worker created it from the message, or a retry
        under the same key raced this one), the record that is there is the job."""
        try:
            self.table.put_item(Item=job, ConditionExpression="attribute_not_exists(job_id)")
        except ClientError as error:
            if not _conditional_failed(error):
                raise
            existing = self._existing(job["job_id"], digest)
            if existing is None:
                raise
            existing.pop("replayed", None)
            return existing
        return job

    def enqueue(self, job_id: str, key: str, record: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"job_id": job_id, "bucket": self.settings.bucket, "key": key}
        if record is not None:
            message["record"] = {name: record[name] for name in RECORD_FIELDS if name in record}
        self.sqs.send_message(QueueUrl=self.settings.queue_url, MessageBody=json.dumps(message))

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
            outcome = Outcome(body=str(record.get("body", "")))
            outcomes[record["messageId"]] = outcome
            try:
                outcome.ref = parse_message(record["body"])
                if outcome.ref is None:
                    outcome.skip = True
                    continue
                receives = int(record.get("attributes", {}).get("ApproximateReceiveCount", "1"))
                state, job = self._claim(outcome.ref, receives)
                outcome.job = job
                if state == SUCCEEDED:
                    outcome.skip = True
                    continue
                if state == FAILED:
                    reason = job.get("error") or {}
                    message = f"job {outcome.ref.job_id} already failed: {reason.get('message', 'unknown reason')}"
                    outcome.error = JobFailed(message, field="job_id", value=outcome.ref.job_id)
                    continue
                # The record says which payload is the job's (a duplicate message may point at another).
                payload = JobRef(outcome.ref.job_id, self.settings.bucket, str(job.get("input_key", outcome.ref.key)))
                outcome.arrays = self.model.decode(self._read(payload), job["content_type"])
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
        """Write the result and mark the job `succeeded`, or record the failure. A failure that another receive
        cannot mend goes to the DLQ with its reason and counts as handled; a retryable one is raised, so that
        SQS delivers the message again."""
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
            job_id = outcome.ref.job_id if outcome.ref is not None else None
            if isinstance(error, JobFailed):
                reason = dict(outcome.job.get("error") or error.to_dict())
            elif not error.retryable:
                reason = error.to_dict()
            elif last:
                reason = error.to_dict() | {"message": f"gave up after {receives} receives: {error.message}"}
            else:
                raise
            if job_id is not None and not isinstance(error, JobFailed | JobNotFound):
                self._fail(job_id, reason)
            if not self._dead_letter(outcome.body, reason, job_id, receives):
                raise
        except Exception as error:
            if receives < self.settings.max_receive_count:
                raise
            reason = {"type": type(error).__name__, "message": f"gave up after {receives} receives: {error}"}
            job_id = outcome.ref.job_id if outcome.ref is not None else None
            if job_id is not None:
                self._fail(job_id, reason)
            if not self._dead_letter(outcome.body, reason, job_id, receives):
                raise

    def _dead_letter(self, body: str, reason: dict[str, Any], job_id: str | None, receives: int) -> bool:
        """Send the message to the DLQ with its reason; False when no DLQ is configured (SQS's redrive then
        moves it, without one)."""
        if not self.settings.dead_letter_queue_url:
            return False
        attributes = {
            "ErrorType": {"DataType": "String", "StringValue": str(reason.get("type") or "Error")[:256]},
            "ErrorMessage": {"DataType": "String", "StringValue": str(reason.get("message") or "-")[:4096]},
            "ReceiveCount": {"DataType": "Number", "StringValue": str(receives)},
        }
        if job_id:
            attributes["JobId"] = {"DataType": "String", "StringValue": job_id}
        self.sqs.send_message(
            QueueUrl=self.settings.dead_letter_queue_url, MessageBody=body or "{}", MessageAttributes=attributes
        )
        return True

    def _claim(self, ref: JobRef, receives: int) -> tuple[str, dict[str, Any]]:
        """Move the job to `running` and return (`running`, record); or (`succeeded` | `failed`, record) when it
        already ended. A message that carries the record creates it when it is not there yet (submit died
        between sending the message and writing the record)."""
        values: dict[str, Any] = {
            ":running": RUNNING,
            ":queued": QUEUED,
            ":zero": 0,
            ":one": 1,
            ":receives": receives,
            ":now": _now(),
        }
        expression = "SET #s = :running, attempts = if_not_exists(attempts, :zero) + :one, "
        expression += "receives = :receives, updated_at = :now"
        condition = "attribute_exists(job_id) AND (#s = :queued OR #s = :running)"
        names = {"#s": "status"}
        if ref.record is not None:
            for index, (name, value) in enumerate(sorted(ref.record.items())):
                expression += f", #r{index} = if_not_exists(#r{index}, :r{index})"
                names[f"#r{index}"], values[f":r{index}"] = name, value
            condition = "attribute_not_exists(job_id) OR #s = :queued OR #s = :running"
        try:
            attributes = self.table.update_item(
                Key={"job_id": ref.job_id},
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )["Attributes"]
        except ClientError as error:
            if not _conditional_failed(error):
                raise
            job = self.get(ref.job_id)  # raises JobNotFound when there is no record at all
            return str(job["status"]), job
        return RUNNING, dict(attributes)

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
