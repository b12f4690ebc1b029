"""The worker's side of async jobs (servestack/adapters/aws/jobs.py submits them): claim, run, commit, dead-letter.

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
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from servestack.adapters.aws.job_records import (
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    JobRef,
    JobStore,
    _conditional_failed,
    _now,
    parse_message,
)
from servestack.inference import media_types
from servestack.inference.errors import InvalidInput, JobFailed, JobNotFound, PayloadTooLarge, ServingError
from servestack.inference.grouping import predict_grouped
from servestack.inference.runtime import Arrays


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


class JobWorker(JobStore):
    """Works through SQS batches of job messages (`work`): `prepare` claims, reads, decodes and predicts them,
    `commit` writes the results and records the outcomes, and dead-letters what it gives up on."""

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
                    done, new = self._write_result(outcome.ref.job_id, outcome.job, outcome.outputs, outcome.arrays)
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

    def _write_result(
        self, job_id: str, job: dict[str, Any], outputs: Arrays, arrays: Arrays | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Write the result object (once: `If-None-Match: *`); returns the `succeeded` record to put, and whether
        this call created the object. A sampled job is captured (its record carries the job id) once its result
        is stored; a redelivery that finds the result written by an earlier one captures nothing more."""
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
        capturer = self.capturer
        if created and arrays is not None and capturer is not None and capturer.sampled():
            capturer.answered(self.model, arrays, encoded, job_id=job_id)
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
