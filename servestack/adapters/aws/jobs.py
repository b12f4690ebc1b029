"""Async jobs on S3 + SQS + DynamoDB: what `servestack/adapters/asynchronous.py` calls.

A job's life: `queued` (submit stored the payload, enqueued the job, then recorded it) -> `succeeded` (result
object written, then the record) or `failed` (with a reason); and `running` in between when a worker claims a
job delivered again (a first delivery goes straight to its outcome: one table write per job, not two).
`JobService` submits jobs and answers their status (here); it inherits the worker's side, which runs them and
holds the rules of retries and dead letters (`JobWorker`, servestack/adapters/aws/job_worker.py). What both
sides share, the settings, the record, the queue message and job ids, is in
servestack/adapters/aws/job_records.py; this module re-exports its names.

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
import time
from typing import Any

from botocore.exceptions import ClientError

from servestack.adapters.aws.idempotency import KeyClaims, same_request
from servestack.adapters.aws.job_records import (
    FAILED,
    IDEMPOTENCY_KEY,
    INLINE_PAYLOAD_BYTES,
    JOB_ID,
    ONE_GIBIBYTE,
    QUEUED,
    RECORD_FIELDS,
    RUNNING,
    SUCCEEDED,
    AsyncSettings,
    JobRef,
    _conditional_failed,
    _now,
    job_id_for,
    parse_message,
)
from servestack.adapters.aws.job_worker import JobWorker, Outcome
from servestack.inference import codecs, media_types
from servestack.inference.errors import InvalidInput, JobNotFound, PayloadTooLarge

__all__ = [
    "FAILED",
    "IDEMPOTENCY_KEY",
    "INLINE_PAYLOAD_BYTES",
    "JOB_ID",
    "ONE_GIBIBYTE",
    "QUEUED",
    "RECORD_FIELDS",
    "RUNNING",
    "SUCCEEDED",
    "AsyncSettings",
    "JobRef",
    "JobService",
    "Outcome",
    "job_id_for",
    "parse_message",
]


class JobService(JobWorker):
    """Submit, status and work for one async deployment."""

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
        """The request type the job records. A body no codec reads (an image, audio, octet-stream, text, a
        form) is taken where the model reads it online (a `preprocess` hook, a declared image input, a tokenizer's
        plain text: `ServedModel.reads_raw`), else refused here with the online 415, before anything is stored."""
        base_type = media_types.media_type_of(content_type)
        if base_type not in media_types.READABLE_TYPES and not self.model.reads_raw(base_type):
            raise codecs.unsupported_media_type(base_type)
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
