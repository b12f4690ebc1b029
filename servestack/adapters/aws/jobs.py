"""Async jobs on S3 + SQS + DynamoDB: what `servestack/adapters/asynchronous.py` calls.

A job's life: `queued` (submit stored the payload, enqueued the job, then recorded it) -> `succeeded` (result
object written, then the record) or `failed` (with a reason); and `running` in between when a worker claims a
job delivered again (a first delivery goes straight to its outcome: one table write per job, not two).
Every transition is a conditional write, so redelivered or duplicated messages are harmless:
- a claim succeeds only from `queued` or `running` (a worker that crashed mid-job may leave `running`);
- the result is written with `If-None-Match: *`, so a job has exactly one result object whatever happens;
- `succeeded` is final: nothing overwrites it, and a message for a succeeded job is simply acknowledged;
- `failed` is final too: a message for a failed job goes to the DLQ with the recorded reason.
Non-retryable errors (the caller's payload is bad) mark the job `failed` at once; retryable ones are left
for SQS to redeliver, and mark it `failed` only on the last receive.

Dead letters carry their reason. SQS's redrive moves a message to the DLQ unchanged, so the worker does it
itself for every message it gives up on: it records `failed` with the reason, sends the message body to the
DLQ with the reason in message attributes (`ErrorType`, `ErrorMessage`, `JobId`, `ReceiveCount`), and
reports the record handled. Only a worker that dies on a message's last receive leaves it to the redrive.

Without an `Idempotency-Key`, the queue, not the table, is where a job begins (an outbox in the queue).
Submit stores the payload, sends the message, then writes the record; the message carries the whole record, so
a worker that finds no record creates it as it claims the job. A crash between the send and the record write
therefore never leaves a job that nobody will run, and a crash before the send leaves no record at all.

With an `Idempotency-Key` (or SageMaker `InferenceId`), the table is where the job begins: the key fixes the
job id, and the job's record is claimed with a conditional write before the payload is stored or anything
enqueued, so that calls sent at once under one key make one job, and a refused one leaves nothing behind
(servestack/adapters/aws/idempotency.py).
"""

from __future__ import annotations

import base64
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

from servestack.adapters.aws.clients import aws_client
from servestack.adapters.aws.idempotency import SUBMITTING, KeyClaims, same_request
from servestack.inference import codecs, media_types
from servestack.inference.errors import (
    InvalidInput,
    JobFailed,
    JobNotFound,
    PayloadTooLarge,
    ServingError,
)
from servestack.inference.grouping import predict_grouped
from servestack.inference.runtime import Arrays
from servestack.inference.service import ModelRepository, ServedModel
from servestack.inference.settings import EnvironmentSettings

ONE_GIBIBYTE = 1024**3
QUEUED, RUNNING, SUCCEEDED, FAILED = "queued", "running", "succeeded", "failed"
# The record fields a job message carries, so that a worker can create the record a crashed submit never wrote.
RECORD_FIELDS = (
    "model",
    "input_key",
    "content_type",
    "accept",
    "created_at",
    "expires_at",
    "request_sha256",
    "input_bytes",
)
# A payload this small also travels inside its message (base64), so the worker need not read it back from S3
# (SQS takes 256 KiB a message; this keeps a job message far below that).
INLINE_PAYLOAD_BYTES = 16 * 1024
# An Idempotency-Key: printable ASCII, at most 255 characters (SageMaker's InferenceId is 1..64 of them).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# What a job id can be: ours are 32 hex digits; an uploaded payload's S3 key names its job.
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class AsyncSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """The async deployment's resources (`SERVESTACK_*`); the CDK construct (servestack/cdk/asynchronous.py) sets the
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
    # How long a keyed submit may take between claiming its key and enqueuing the job: no call lives longer
    # (the submit function's timeout is 15 s; an HTTP API integration's is at most 30 s). A retry after it
    # takes over a claim whose call died.
    submit_timeout_sec: Annotated[int, msgspec.Meta(ge=1)] = 30

    @property
    def upload_prefix(self) -> str:
        """Large payloads land here through a presigned PUT; an S3 notification on it starts the job."""
        return f"{self.request_prefix}uploads/"


@dataclass(frozen=True)
class JobRef:
    """What a queue message says: which job, where its payload is, and (our own messages) its record and,
    when small, the payload itself."""

    job_id: str
    bucket: str
    key: str
    record: dict[str, Any] | None = None
    payload: bytes | None = None


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
        inline = message.get("payload")
        try:
            payload = base64.b64decode(inline, validate=True) if isinstance(inline, str) else None
        except ValueError:
            payload = None  # unreadable: the worker reads the payload from S3 instead
        return JobRef(
            str(message["job_id"]),
            str(message["bucket"]),
            str(message["key"]),
            record if record else None,
            payload,
        )
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
    """A record's fate: after the claim/read/decode/predict pass (`prepare`), then after `commit`, which
    leaves in `retry` the error to raise for a record SQS must deliver again."""

    body: str = ""
    receives: int = 1
    ref: JobRef | None = None
    job: dict[str, Any] = field(default_factory=dict)
    arrays: Arrays | None = None
    outputs: Arrays | None = None
    error: Exception | None = None
    skip: bool = False
    retry: Exception | None = None


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
        body = media_types.decode_content(body, content_encoding, self.settings.max_decoded_bytes)
        digest = hashlib.sha256(body).hexdigest()
        job_id = job_id_for(idempotency_key)
        key = f"{self.settings.request_prefix}{job_id}"
        if idempotency_key is not None:
            # The key first: nothing is stored or enqueued for a request the key does not name (module doc).
            job = self.new_record(job_id, f"{key}-{digest[:16]}", media_type, accept, len(body), digest)
            claims, answer_type = KeyClaims(self.table, self.settings.submit_timeout_sec, QUEUED), job["accept"]
            replay = claims.claim(job, lambda claimed: self._existing(claimed, digest, media_type, answer_type))
            if replay is not None:
                return replay
            self.s3.put_object(Bucket=self.settings.bucket, Key=job["input_key"], Body=body, ContentType=media_type)
            self.enqueue(job_id, job["input_key"], job, payload=body)  # may learn where the job will write
            claims.release(job)
            return job
        self.s3.put_object(Bucket=self.settings.bucket, Key=key, Body=body, ContentType=media_type)
        job = self.new_record(job_id, key, media_type, accept, len(body), digest)
        # First the message: once it exists the job will run, whatever happens to this call (see the module doc).
        self.enqueue(job_id, key, job, payload=body)
        return self._record(job, digest)

    def _check_types(self, content_type: str | None, accept: str | None) -> str:
        base_type = media_types.media_type_of(content_type)
        if base_type not in media_types.READABLE_TYPES:
            codecs.decode_body(b"", base_type)  # raises UnsupportedMediaType naming the allowed types
        media_types.negotiate(accept)
        return media_types.request_type_of(content_type)  # `text/csv; header=present` stays so for the worker

    def _existing(
        self, job_id: str, digest: str | None, media_type: str | None = None, answer_type: str | None = None
    ) -> dict[str, Any] | None:
        """The job an idempotency key already made, or None; another request under the key is refused (422)."""
        try:
            job = self.get(job_id)
        except JobNotFound:
            return None
        same_request(job, digest, media_type, answer_type)
        job["replayed"] = True
        return job

    def create_upload(
        self, content_type: str | None, accept: str | None, *, idempotency_key: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """Record a job whose payload the caller PUTs to S3; it starts on the S3 event or on confirm."""
        media_type = self._check_types(content_type, accept)
        job_id = job_id_for(idempotency_key)
        answer_type = media_types.negotiate(accept)
        existing = self._existing(job_id, None, media_type, answer_type) if idempotency_key is not None else None
        if existing is not None:
            job = existing
        else:
            key = f"{self.settings.upload_prefix}{job_id}"
            job = self._record(self.new_record(job_id, key, media_type, accept, None, None), None)
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

    def new_record(
        self, job_id: str, key: str, media_type: str, accept: str | None, size: int | None, digest: str | None
    ) -> dict[str, Any]:
        """A `queued` job record for the payload at `key`."""
        now = _now()
        job: dict[str, Any] = {
            "job_id": job_id,
            "status": QUEUED,
            "model": self.model.manifest.key,
            "input_key": key,
            "content_type": media_type,
            "accept": media_types.answer_type_of(accept),
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
            existing = self._existing(job["job_id"], digest, job["content_type"], job["accept"])
            if existing is None:
                raise
            existing.pop("replayed", None)
            return existing
        return job

    def job_message(
        self, job_id: str, key: str, record: dict[str, Any] | None = None, *, payload: bytes | None = None
    ) -> str:
        """The queue message of a job: where its payload is; the record's fields, so that a worker can create a
        record a crashed submit never wrote; and a payload of at most INLINE_PAYLOAD_BYTES itself."""
        message: dict[str, Any] = {"job_id": job_id, "bucket": self.settings.bucket, "key": key}
        if record is not None:
            message["record"] = {name: record[name] for name in RECORD_FIELDS if name in record}
        if payload is not None and len(payload) <= INLINE_PAYLOAD_BYTES and record and "request_sha256" in record:
            message["payload"] = base64.b64encode(payload).decode()
        return json.dumps(message)

    def enqueue(
        self, job_id: str, key: str, record: dict[str, Any] | None = None, *, payload: bytes | None = None
    ) -> None:
        body = self.job_message(job_id, key, record, payload=payload)
        self.sqs.send_message(QueueUrl=self.settings.queue_url, MessageBody=body)

    # ----------------------------------------------------------------------------------------- status

    def get(self, job_id: str) -> dict[str, Any]:
        """The job's record; `JobNotFound` for an id that is none (a hostile one never reaches the table, which
        would refuse a key of over 2 KiB with an error of its own)."""
        if not JOB_ID.fullmatch(job_id):
            raise JobNotFound(
                "job_id: not a job id", field="job_id", value=job_id[:80], allowed="an id POST /jobs returned"
            )
        item = self.table.get_item(Key={"job_id": job_id}, ConsistentRead=True).get("Item")
        if item is None:
            raise JobNotFound(f"job {job_id!r} does not exist (or has expired)", field="job_id", value=job_id)
        numbers = ("attempts", "expires_at", "input_bytes", SUBMITTING)
        return {k: (int(v) if k in numbers else v) for k, v in item.items()}

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
                "content_type": job.get("result_type", media_types.JSON),
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

    def work(self, records: list[dict[str, Any]]) -> dict[str, Outcome]:
        """A batch of SQS records end to end: `prepare`, then `commit`. Outcomes by message id; an outcome with
        `retry` set must be reported as a batch item failure."""
        outcomes = self.prepare(records)
        self.commit(list(outcomes.values()))
        return outcomes

    def prepare(self, records: list[dict[str, Any]]) -> dict[str, Outcome]:
        """Claim, read and decode every record, then predict them together where shapes allow."""
        outcomes: dict[str, Outcome] = {}
        claims: list[Outcome] = []
        seen: set[str] = set()
        for record in records:
            receives = int(record.get("attributes", {}).get("ApproximateReceiveCount", "1"))
            outcome = Outcome(body=str(record.get("body", "")), receives=receives)
            outcomes[record["messageId"]] = outcome
            try:
                outcome.ref = parse_message(record["body"])
            except ServingError as error:
                outcome.error = error
                continue
            if outcome.ref is None or outcome.ref.job_id in seen:
                outcome.skip = True  # nothing to do, or the same job twice in one batch: once is enough
                continue
            seen.add(outcome.ref.job_id)
            claims.append(outcome)
        self._claim_all(claims)
        for outcome in claims:
            if outcome.error is not None or outcome.skip:
                continue
            try:
                assert outcome.ref is not None
                outcome.arrays = self.model.decode(self._payload(outcome.ref, outcome.job), outcome.job["content_type"])
            except Exception as error:  # recorded, then settled for this record alone by `commit`
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

    def commit(self, outcomes: list[Outcome]) -> None:
        """Write each result object and record its success; record and dead-letter the failures another receive
        cannot mend, and leave `retry` on the ones it can."""
        created: list[tuple[Outcome, dict[str, Any]]] = []  # results this delivery wrote
        found: list[tuple[Outcome, dict[str, Any]]] = []  # results an earlier delivery had written
        for outcome in outcomes:
            if outcome.skip:
                continue
            if outcome.error is None:
                try:
                    assert outcome.ref is not None
                    assert outcome.outputs is not None
                    done, new = self._write_result(outcome.ref.job_id, outcome.job, outcome.outputs)
                    (created if new else found).append((outcome, done))
                    continue
                except Exception as error:
                    outcome.error = error
            try:
                self._settle_failure(outcome)
            except Exception as error:  # the table or the DLQ is not reachable: SQS delivers it again
                outcome.retry = error
        try:
            # A job whose result object this delivery created cannot have been recorded `succeeded` before
            # (success is recorded after the result), so its record needs no condition, and the batch's records
            # go in BatchWriteItem calls of 25 (boto3's batch writer resends what DynamoDB leaves unprocessed).
            with self.table.batch_writer() as batch:
                for _, done in created:
                    batch.put_item(Item=done)
        except Exception as error:
            for outcome, _ in created:
                outcome.retry = error
        for outcome, done in found:
            try:
                self._record_success(done)
            except Exception as error:
                outcome.retry = error

    def _settle_failure(self, outcome: Outcome) -> None:
        """A failed record: retryable and not yet on its last receive -> `retry`; else record `failed` with the
        reason and send the message to the DLQ with it (without a DLQ: `retry`, for SQS's redrive)."""
        error = outcome.error
        assert error is not None
        receives = outcome.receives
        last = receives >= self.settings.max_receive_count
        job_id = outcome.ref.job_id if outcome.ref is not None else None
        if isinstance(error, JobFailed):
            reason = dict(outcome.job.get("error") or error.to_dict())
        elif isinstance(error, ServingError) and not error.retryable:
            reason = error.to_dict()
        elif not last:
            outcome.retry = error
            return
        elif isinstance(error, ServingError):
            reason = error.to_dict() | {"message": f"gave up after {receives} receives: {error.message}"}
        else:
            reason = {"type": type(error).__name__, "message": f"gave up after {receives} receives: {error}"}
        if job_id is not None and not isinstance(error, JobFailed | JobNotFound):
            self._fail(job_id, reason, outcome.job if "input_key" in outcome.job else None)
        if not self._dead_letter(outcome.body, reason, job_id, receives):
            outcome.retry = error

    def _claim_all(self, outcomes: list[Outcome]) -> None:
        """Claim each job of a batch (see `_claim`); a job that already ended is skipped or failed fast.

        A first delivery whose message carries the record is not claimed: the one write of its outcome
        follows within this invocation, and a claim would double the table writes of every job. A job is
        recorded `running` when it is delivered again (a worker failed with it, or a duplicate message), where
        the claim also stops work on a job that already ended."""
        for outcome in outcomes:
            try:
                assert outcome.ref is not None
                if outcome.ref.record is not None and outcome.receives <= 1:
                    outcome.job = self._claimed_record(outcome.ref, outcome.receives)
                    continue
                state, outcome.job = self._claim(outcome.ref, outcome.receives)
            except Exception as error:
                outcome.error = error
                continue
            if state == SUCCEEDED:
                outcome.skip = True
            elif state == FAILED:
                reason = outcome.job.get("error") or {}
                message = f"job {outcome.ref.job_id} already failed: {reason.get('message', 'unknown reason')}"
                outcome.error = JobFailed(message, field="job_id", value=outcome.ref.job_id)

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

    def _claimed_record(self, ref: JobRef | None, receives: int) -> dict[str, Any]:
        """The whole record of a job claimed from a message that carries it: `running`, and `attempts` is the
        message's receive count."""
        assert ref is not None
        assert ref.record is not None
        job = {"job_id": ref.job_id, "updated_at": _now(), **ref.record}
        return job | {"status": RUNNING, "attempts": receives, "receives": receives}

    def _claim(self, ref: JobRef, receives: int) -> tuple[str, dict[str, Any]]:
        """Move one job to `running` and return (`running`, record); or (`succeeded` | `failed`, record) when it
        already ended. A message that carries the record writes it whole, so one conditional put claims the
        job whether or not submit lived to write the record."""
        if ref.record is not None:
            job = self._claimed_record(ref, receives)
            try:
                self.table.put_item(
                    Item=job,
                    ConditionExpression="attribute_not_exists(job_id) OR #s = :queued OR #s = :running",
                    ExpressionAttributeNames={"#s": "status"},
                    ExpressionAttributeValues={":queued": QUEUED, ":running": RUNNING},
                )
                return RUNNING, job
            except ClientError as error:
                if not _conditional_failed(error):
                    raise
                ended = self.get(ref.job_id)
                return str(ended["status"]), ended
        try:  # an S3 upload notification: the record was written by create_upload
            attributes = self.table.update_item(
                Key={"job_id": ref.job_id},
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
            job = self.get(ref.job_id)  # raises JobNotFound when there is no record at all
            return str(job["status"]), job
        return RUNNING, dict(attributes)

    def _payload(self, ref: JobRef, job: dict[str, Any]) -> bytes:
        """The job's payload: the copy its message carries when it is the recorded one, else the S3 object the
        record names (a duplicate message may point at another)."""
        if ref.payload is not None and job.get("request_sha256") == hashlib.sha256(ref.payload).hexdigest():
            return ref.payload
        return self._read(JobRef(ref.job_id, self.settings.bucket, str(job.get("input_key", ref.key))))

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

    def _write_result(self, job_id: str, job: dict[str, Any], outputs: Arrays) -> tuple[dict[str, Any], bool]:
        """Write the result object (once: `If-None-Match: *`); returns the `succeeded` record to put, and whether
        this call created the object."""
        encoded = self.model.answer(outputs, job.get("accept") or media_types.JSON)
        key = f"{self.settings.result_prefix}{job_id}"
        created = True
        try:
            self.s3.put_object(
                Bucket=self.settings.bucket, Key=key, Body=encoded.body, ContentType=encoded.media_type, IfNoneMatch="*"
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise
            created = False  # an earlier delivery wrote it and crashed before recording success: it stands
        return {name: value for name, value in job.items() if name != "error"} | {
            "job_id": job_id,
            "status": SUCCEEDED,
            "result_key": key,
            "result_type": encoded.media_type,
            "updated_at": _now(),
        }, created

    def _record_success(self, done: dict[str, Any]) -> None:
        """Put the whole `succeeded` record (the claim gave this worker all of it), never over a success."""
        self._put_unless_succeeded(done)

    def _put_unless_succeeded(self, item: dict[str, Any]) -> None:
        """Put the whole record, unless the job has already succeeded (then the put is a no-op)."""
        try:
            self.table.put_item(
                Item=item,
                ConditionExpression="attribute_not_exists(job_id) OR #s <> :succeeded",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":succeeded": SUCCEEDED},
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise

    def _fail(self, job_id: str, reason: dict[str, Any], record: dict[str, Any] | None = None) -> None:
        """Record `failed` with a reason, never over a success. With the job's `record` (from its message) the
        whole record is put, so a job whose submit died before writing it still ends `failed` in the table."""
        error = json.loads(json.dumps(reason, default=str), parse_float=Decimal)
        if record is not None:
            failed = {name: value for name, value in record.items() if name not in ("result_key", "result_type")}
            failed |= {"job_id": job_id, "status": FAILED, "error": error, "updated_at": _now()}
            self._put_unless_succeeded(failed)
            return
        try:
            self.table.update_item(
                Key={"job_id": job_id},
                UpdateExpression="SET #s = :failed, #e = :error, updated_at = :now",
                ConditionExpression="attribute_exists(job_id) AND #s <> :succeeded",
                ExpressionAttributeNames={"#s": "status", "#e": "error"},
                ExpressionAttributeValues={
                    ":failed": FAILED,
                    ":succeeded": SUCCEEDED,
                    ":error": error,
                    ":now": _now(),
                },
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise
