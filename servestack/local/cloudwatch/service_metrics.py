"""The metrics AWS's own services publish that local mode counts where it plays the service, so that an alarm over
them is evaluated locally as CloudWatch evaluates it (servestack/local/cloudwatch/alarms.py):

- `AWS/Lambda` `Errors` (`FunctionName`): a failed invocation (the handler raised or timed out), counted by local
  up's Lambda service whoever invoked the function, asynchronous invocations included
  (servestack/local/lambda_/service.py). Only failures are put: a period without one has no datapoint, which the
  alarms over it (`FILL(..., 0)`, or missing data not breaching) read as none.
- `AWS/Scheduler` `TargetErrorCount` (`ScheduleGroup`): an attempt of a schedule to start its target that failed
  (refused by IAM, a function that does not answer, RunTask refused), counted by the local scheduler.
- `AWS/SQS` `ApproximateNumberOfMessagesVisible` (`QueueName`): the queue's depth, read (GetQueueAttributes, by the
  developer) and put when an alarm over it is evaluated, where SQS samples it every minute.

Each is put to the emulator's CloudWatch by the developer, standing for the service: the functions' and schedules'
roles are not asked for `cloudwatch:PutMetricData`, as AWS's services need no grant of theirs to publish.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger("servestack.local")

LAMBDA_ERRORS = ("AWS/Lambda", "Errors")
SCHEDULER_TARGET_ERRORS = ("AWS/Scheduler", "TargetErrorCount")
QUEUE_DEPTH = ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
# The one dimension each is counted with (an alarm on another, a function's alias say, gets no datapoint here)
SERVICE_DIMENSION = {LAMBDA_ERRORS: "FunctionName", SCHEDULER_TARGET_ERRORS: "ScheduleGroup", QUEUE_DEPTH: "QueueName"}


class ServiceCounter:
    """Counts one event of a service's metric on the emulator's CloudWatch (`cloudwatch`: the developer's client),
    off the caller's thread: a failed invocation or schedule attempt never waits on CloudWatch, and a refused put
    is local mode's own failure, logged."""

    def __init__(self, cloudwatch: Any) -> None:
        self.cloudwatch = cloudwatch

    def function_failed(self, function_name: str) -> None:
        self._count(LAMBDA_ERRORS, function_name)

    def target_failed(self, schedule_group: str) -> None:
        self._count(SCHEDULER_TARGET_ERRORS, schedule_group)

    def _count(self, metric: tuple[str, str], value: str) -> None:
        namespace, name = metric
        datum = {
            "MetricName": name,
            "Dimensions": [{"Name": SERVICE_DIMENSION[metric], "Value": value}],
            "Timestamp": datetime.now(UTC),
            "Value": 1.0,
            "Unit": "Count",
        }

        def put() -> None:
            try:
                self.cloudwatch.put_metric_data(Namespace=namespace, MetricData=[datum])
            except Exception as error:
                logger.error("%s %s of %s not counted: %s", namespace, name, value, error)

        threading.Thread(target=put, name=f"count-{name}", daemon=True).start()


def sample_queue_depths(cloudwatch: Any, sqs: Any, queue_names: Iterable[str]) -> None:
    """Put each named queue's visible messages now, as SQS's own sample of `ApproximateNumberOfMessagesVisible`; a
    queue that does not answer gets no datapoint (the alarm's FILL or missing data then applies)."""
    now = datetime.now(UTC)
    for name in sorted(set(queue_names)):
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            depth = float(attributes["Attributes"]["ApproximateNumberOfMessages"])
            cloudwatch.put_metric_data(
                Namespace=QUEUE_DEPTH[0],
                MetricData=[{"MetricName": QUEUE_DEPTH[1], "Dimensions": [{"Name": "QueueName", "Value": name}],
                             "Timestamp": now, "Value": depth, "Unit": "Count"}],
            )  # fmt: skip
        except Exception as error:
            logger.warning("queue %s: its depth was not sampled: %s", name, error)
