"""What an async job is on S3, SQS and DynamoDB, for both sides: submit and status
(servestack/adapters/aws/jobs.py) and the worker (servestack/adapters/aws/job_worker.py). The deployment's
settings, the record's states and the fields its message carries, the message format, job ids, and `JobStore`:
the clients both sides use, and reading a job's record.
"""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import boto3
import msgspec
import orjson
from botocore.exceptions import ClientError

from servestack.adapters.aws.clients import aws_client
from servestack.adapters.aws.idempotency import SUBMITTING
from servestack.inference.capture import capturer_from
from servestack.inference.errors import InvalidInput, JobNotFound
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


class JobStore:
    """The bucket, queue and table of one async deployment, and reading a job's record from the table."""

    def __init__(self, settings: AsyncSettings, repository: ModelRepository, model: ServedModel) -> None:
        self.settings = settings
        self.repository = repository
        self.model = model
        self.s3 = aws_client("s3")
        self.sqs = aws_client("sqs")
        self.table = boto3.resource("dynamodb").Table(settings.jobs_table)
        self.capturer = capturer_from(repository.settings.capture)

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
