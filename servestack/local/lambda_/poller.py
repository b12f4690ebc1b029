"""The SQS event source mapping, on this machine: long-poll a queue, call the function with SQS batch events.

It runs in the `local up` process, as part of the Lambda service, with the function's execution role (that
role's `sqs:ReceiveMessage`/`DeleteMessage`/`GetQueueAttributes` grants are what AWS's poller uses too), and
invokes the function through the Lambda service (servestack/local/lambda_/service.py).

Like Lambda's poller it gathers up to `batch_size` messages within `batch_window_sec`, builds the exact
event Lambda sends (`Records` with `messageId`, `receiptHandle`, `attributes`, `messageAttributes`,
`eventSourceARN`...), invokes the function, deletes the records that succeeded and leaves the ones in
`batchItemFailures` (or all of them, when the invocation failed) to reappear after the queue's visibility
timeout, and so, after `maxReceiveCount` receives, to move to the DLQ.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from servestack.local.lambda_.runtime import REGION

logger = logging.getLogger("servestack.local")
MAX_RECEIVE = 10  # SQS returns at most 10 messages per call


def lambda_record(message: dict[str, Any], queue_arn: str) -> dict[str, Any]:
    """One SQS message as it appears in a Lambda event."""
    attributes = {
        key: value
        for key, value in message.get("Attributes", {}).items()
        if key
        in (
            "ApproximateReceiveCount",
            "SentTimestamp",
            "SenderId",
            "ApproximateFirstReceiveTimestamp",
            "SequenceNumber",
            "MessageGroupId",
            "MessageDeduplicationId",
            "AWSTraceHeader",
        )
    }
    message_attributes = {
        name: {
            "stringValue": value.get("StringValue"),
            "binaryValue": value.get("BinaryValue"),
            "stringListValues": value.get("StringListValues", []),
            "binaryListValues": value.get("BinaryListValues", []),
            "dataType": value["DataType"],
        }
        for name, value in message.get("MessageAttributes", {}).items()
    }
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": REGION,
    }


class Invoker(Protocol):
    """A function to call with an event: returns its result, raises when the invocation failed."""

    name: str

    def invoke(self, event: Any) -> Any: ...


class SqsPoller:
    """Feed `function` from `queue_url` until `stop` is set."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        function: Invoker,
        *,
        batch_size: int = 10,
        report_batch_item_failures: bool = True,
        batch_window_sec: float = 0,
        wait_sec: int = 1,  # a long poll local up waits out when it stops: short, so that stopping is quick
    ) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.function = function
        self.batch_size = batch_size
        # Without `ReportBatchItemFailures` on the mapping, Lambda ignores a response's `batchItemFailures`: a
        # normal return settles the whole batch (and so does this poller).
        self.report_batch_item_failures = report_batch_item_failures
        self.batch_window_sec = batch_window_sec
        self.wait_sec = wait_sec
        self.queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        self.invocations = 0

    def _receive(self, limit: int, wait_sec: int) -> list[dict[str, Any]]:
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=min(MAX_RECEIVE, limit),
            WaitTimeSeconds=wait_sec,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages

    def gather(self, stop: threading.Event) -> list[dict[str, Any]]:
        """Up to `batch_size` messages: long-poll for the first, then fill until the window closes."""
        batch = self._receive(self.batch_size, self.wait_sec)
        if not batch:
            return batch
        closes = time.monotonic() + self.batch_window_sec
        while len(batch) < self.batch_size and not stop.is_set():
            remaining = closes - time.monotonic()
            if remaining <= 0:
                break
            more = self._receive(self.batch_size - len(batch), min(20, int(remaining)))
            batch += more
            if not more and remaining < 1:
                break
        return batch

    def run_once(self, stop: threading.Event) -> int:
        """One receive + invoke + delete cycle; returns how many messages it handled."""
        messages = self.gather(stop)
        if not messages:
            return 0
        event = {"Records": [lambda_record(m, self.queue_arn) for m in messages]}
        self.invocations += 1
        try:
            response = self.function.invoke(event)
            reported = (response or {}).get("batchItemFailures", []) if self.report_batch_item_failures else []
            failed = {item["itemIdentifier"] for item in reported}
        except Exception:
            logger.exception(
                "%s: invocation failed; all %d messages will be retried", self.function.name, len(messages)
            )
            return len(messages)
        done = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done[start : start + 10])
            ]
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
        if failed:
            logger.info(
                "%s: %d of %d records failed and will be retried", self.function.name, len(failed), len(messages)
            )
        return len(messages)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once(stop)
            except Exception:  # the emulator went away, a network blip: keep polling, as Lambda does
                logger.exception("%s: polling failed", self.function.name)
                stop.wait(1)
