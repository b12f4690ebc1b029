"""Idempotency-Key claims in the job table: what makes keyed submits safe when they arrive at once.

A keyed submit's job is claimed before its payload is stored or anything enqueued, as Powertools' idempotency
utility claims its record and the IETF Idempotency-Key header draft asks: one conditional put of the job's
`queued` record (`attribute_not_exists(job_id)`), marked with `submitting_until` (epoch seconds: how long the
claiming call may still be at it). Of calls sent at once under one key, one claims it; each other one is
answered from the claim:
- another request under the key (another body, `Content-Type` or `Accept`): 422 `IdempotencyConflict`, having
  stored and enqueued nothing;
- the same request while the claim is being submitted: 409 `IdempotencyInProgress` (retry shortly);
- the same request once submitted: the job, to replay.
The claiming call then stores the payload, enqueues the job and puts the record again without the mark. Both
writes are whole, conditional PutItems: the submit role is granted GetItem and PutItem on the table, nothing
more. A claim whose call died before its second write is taken over, once its time has passed, by the next retry
of the same request, which stores and enqueues again (the worker's conditional writes make a second message
harmless). A mark left on a record that a worker or a notification has since moved on from `queued` means
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from servestack.inference.errors import IdempotencyConflict, IdempotencyInProgress

SUBMITTING = "submitting_until"
SAME_REQUEST = "a new key for a new request; the same key only to retry the same request"


def same_request(job: Mapping[str, Any], digest: str | None, media_type: str | None, answer_type: str | None) -> None:
    """Refuse (422) a request under a key whose job was made by another one: another body, or another
    `Content-Type` (the body would be read differently) or `Accept` (the job's result is written once, in the
    type the first request negotiated, so a replay cannot honour another)."""
    recorded = job.get("request_sha256")
    if digest is not None and recorded is not None and recorded != digest:
        raise IdempotencyConflict(
            "Idempotency-Key: this key was used for a different request body",
            field="Idempotency-Key",
            value=job.get("job_id"),
            allowed=SAME_REQUEST,
        )
    for header, asked, first in (
        ("Content-Type", media_type, job.get("content_type")),
        ("Accept", answer_type, job.get("accept")),
    ):
        if asked is not None and first is not None and asked != first:
            said = f"this key was used with {header}: {first}, and this request negotiates {asked}"
            raise IdempotencyConflict(
                f"Idempotency-Key: {said}",
                field=header,
                value=asked,
                allowed=f"{first} under this key ({SAME_REQUEST})",
            )


def _refused_by_condition(error: ClientError) -> bool:
    return bool(error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException")


class KeyClaims:
    """Claims of keyed jobs' records in `table` (a boto3 DynamoDB Table); `queued` is the status a job starts in."""

    def __init__(self, table: Any, submit_timeout_sec: int, queued: str) -> None:
        self.table = table
        self.submit_timeout_sec = submit_timeout_sec
        self.queued = queued

    def claim(self, job: dict[str, Any], read: Callable[[str], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Claim `job`'s record for this call: None when this call must submit `job` (then `release` it), else
        the job to replay (`read` gives the record there is, refusing another request with 422); 409 while
        another call submits the same request. A dead call's claim is taken over: `job` becomes that record."""
        now = int(time.time())
        deadline = now + self.submit_timeout_sec
        job[SUBMITTING] = deadline
        try:
            self.table.put_item(Item=job, ConditionExpression="attribute_not_exists(job_id)")
            return None
        except ClientError as error:
            if not _refused_by_condition(error):
                raise
        existing = read(job["job_id"])
        assert existing is not None  # the conditional put found it; records are never deleted, only expire
        pending = existing.pop(SUBMITTING, None)
        if pending is None or existing["status"] != self.queued:
            return existing
        in_progress = IdempotencyInProgress(
            "Idempotency-Key: a request with this key is still being submitted; retry shortly",
            field="Idempotency-Key",
            value=job["job_id"],
            allowed=f"a retry after the first call answered, or after {self.submit_timeout_sec} s",
        )
        if pending >= now:
            raise in_progress
        existing.pop("replayed", None)
        try:  # the claiming call died before enqueuing: take its claim over, unless another retry just did
            self._put_if_claimed(existing | {SUBMITTING: deadline}, pending)
        except ClientError as error:
            if not _refused_by_condition(error):
                raise
            raise in_progress from None
        job.clear()
        job.update(existing | {SUBMITTING: deadline})
        return None

    def release(self, job: dict[str, Any]) -> None:
        """Put the submitted job's record without the claim's mark; a worker or SageMaker's notification that
        wrote the record first has already dropped it."""
        mark = job.pop(SUBMITTING)
        try:
            self._put_if_claimed(job, mark)
        except ClientError as error:
            if not _refused_by_condition(error):
                raise  # the job is enqueued: a retry is answered from its record once the mark's time has passed

    def _put_if_claimed(self, item: dict[str, Any], mark: int) -> None:
        """Put the whole record while it is still `queued` under the claim `mark`."""
        self.table.put_item(
            Item=item,
            ConditionExpression="#p = :mark AND #s = :queued",
            ExpressionAttributeNames={"#p": SUBMITTING, "#s": "status"},
            ExpressionAttributeValues={":mark": mark, ":queued": self.queued},
        )
