"""The scheduled drift check's failure alarm (servestack/cdk/monitoring.py) as local mode plays it, on the emulator's
CloudWatch: its three metrics are counted where local mode plays the service (servestack/local/cloudwatch/
service_metrics.py), so that a check that raises, or a schedule that cannot invoke it, is an alarm rather than
silence.

- The check raising, in a scheduled (asynchronous) invocation: local up's Lambda service runs the event, sees the
  function error, and counts the function's `Errors`.
- The schedule's role refused: each attempt counts in the group's `TargetErrorCount`, and the event ends in the
  dead-letter queue, whose depth is sampled when the alarm is evaluated.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from servestack.local.cloudwatch import AlarmDef, ServiceCounter, ensure_alarm, evaluate_alarms
from servestack.local.cloudwatch.alarms import alarm_of
from servestack.local.emulator.moto_server import EmbeddedEmulator, client_as
from servestack.local.iam import DEVELOPER
from servestack.local.lambda_ import LambdaService
from servestack.local.lambda_.definitions import FunctionDef
from servestack.local.lambda_.invoke import FunctionHost, function_arn
from servestack.local.lambda_.runtime import LocalFunction
from servestack.local.lambda_.service import HostedFunction
from servestack.local.scheduler import ScheduleDef, ScheduleRunner, send_dead_letter
from tests.waiting import wait_for


def failure_alarm(name: str, function: str, queue: str) -> AlarmDef:
    """The failure alarm the construct gives deployment `name` with `monitor:`, resolved as local up resolves it."""
    return alarm_of({
        "AlarmName": f"{name}-monitor-failures",
        "ComparisonOperator": "GreaterThanThreshold",
        "EvaluationPeriods": 1,
        "Threshold": 0,
        "TreatMissingData": "notBreaching",
        "Metrics": [
            {"Expression": "FILL(failed, 0) + FILL(target_errors, 0) + FILL(dlq, 0)", "Id": "expr_1",
             "ReturnData": True},
            {"Id": "failed", "ReturnData": False, "MetricStat": {"Period": 300, "Stat": "Sum", "Metric": {
                "Namespace": "AWS/Lambda", "MetricName": "Errors",
                "Dimensions": [{"Name": "FunctionName", "Value": function}]}}},
            {"Id": "target_errors", "ReturnData": False, "MetricStat": {"Period": 300, "Stat": "Sum", "Metric": {
                "Namespace": "AWS/Scheduler", "MetricName": "TargetErrorCount",
                "Dimensions": [{"Name": "ScheduleGroup", "Value": name}]}}},
            {"Id": "dlq", "ReturnData": False, "MetricStat": {"Period": 300, "Stat": "Maximum", "Metric": {
                "Namespace": "AWS/SQS", "MetricName": "ApproximateNumberOfMessagesVisible",
                "Dimensions": [{"Name": "QueueName", "Value": queue}]}}},
        ],
    })  # fmt: skip


@dataclass
class Local:
    name: str  # the deployment's resource name (its schedule group's)
    function: str
    queue: str
    cloudwatch: Any
    sqs: Any
    lambdas: LambdaService
    checks: list[dict[str, Any]]  # the events the check's function was given

    @property
    def alarm(self) -> AlarmDef:
        return failure_alarm(self.name, self.function, self.queue)

    def queue_depth(self) -> str:
        url = self.sqs.get_queue_url(QueueName=self.queue)["QueueUrl"]
        found = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        return str(found["Attributes"]["ApproximateNumberOfMessages"])


def check_that_cannot_read_its_capture(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The check's function, as it ends on a capture object that is not UTF-8 text (a gzip-compressed copy)."""
    raise UnicodeDecodeError("utf-8", b"\x1f\x8b", 0, 1, "invalid start byte")


@pytest.fixture
def local() -> Iterator[Local]:
    """The check's function in an execution environment of this process, and local up's Lambda service counting its
    failures on an emulator; names of their own (moto's metrics outlive one emulator in a process)."""
    emulator = EmbeddedEmulator()
    name = f"servestack-wine-{uuid.uuid4().hex[:8]}"
    function, queue = f"{name}-MonitorFunction-0123456789AB", f"{name}-MonitorDeadLetters-0123456789AB"
    checks: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        checks.append(event)
        return check_that_cannot_read_its_capture(event, context)

    host = FunctionHost({function: LocalFunction(function, handler, timeout_sec=30)}).serve_in_background()
    cloudwatch = client_as("cloudwatch", emulator.url, DEVELOPER, "us-east-1")
    sqs = client_as("sqs", emulator.url, DEVELOPER, "us-east-1")
    sqs.create_queue(QueueName=queue)
    handler_path = "servestack.monitor.scheduled.handler"
    definition = FunctionDef("MonitorFunction", function, function_arn(function), handler_path, {}, 30, 2048, None,
                             "MonitorFunctionRole")  # fmt: skip
    lambdas = LambdaService([HostedFunction(definition, host.url, False)],
                            on_failure=ServiceCounter(cloudwatch).function_failed)  # fmt: skip
    try:
        yield Local(name, function, queue, cloudwatch, sqs, lambdas, checks)
    finally:
        lambdas.close()
        host.close()
        emulator.stop()


def runner(local: Local, *, refused: bool) -> ScheduleRunner:
    """The check's schedule, its role allowed to invoke the function or refused."""
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{local.queue}"
    schedule = ScheduleDef("MonitorSchedule", f"{local.name}-monitor", "rate(1 day)", "UTC", True,
                           function_arn(local.function), "arn:aws:iam::123456789012:role/scheduler", None, 2, 3600,
                           queue_arn, group=local.name)  # fmt: skip

    def authorize(role: str, action: str, resource: str) -> str | None:
        return f"{role} is not authorized to perform: {action} on resource: {resource}" if refused else None

    def dead_letter(queue_arn: str, body: str, attributes: dict[str, Any]) -> None:
        send_dead_letter(local.sqs, local.sqs.meta.endpoint_url, queue_arn, body, attributes)

    counter = ServiceCounter(local.cloudwatch)
    return ScheduleRunner(schedule, local.lambdas, authorize, dead_letter, on_target_error=counter.target_failed,
                          backoff_sec=0)  # fmt: skip


def alarm_reason(local: Local, total: float) -> str | None:
    """The alarm's state reason once an evaluation (the queue's depth sampled first) finds it in ALARM at `total`
    (the counts are put off the failing caller's thread: they arrive in any order)."""
    alarm = local.alarm
    if evaluate_alarms(local.cloudwatch, [alarm], sqs=local.sqs) != {alarm.name: "ALARM"}:
        return None
    (described,) = local.cloudwatch.describe_alarms(AlarmNames=[alarm.name])["MetricAlarms"]
    reason = str(described["StateReason"])
    if not reason.startswith(f"Threshold Crossed: 1 datapoint [{total} ("):
        # the state was set on an earlier count: evaluate from scratch, as the next period would
        local.cloudwatch.set_alarm_state(AlarmName=alarm.name, StateValue="OK", StateReason="recount")
        return None
    return reason


def test_a_check_that_raises_is_counted_in_its_functions_errors_and_raises_the_failure_alarm(local: Local) -> None:
    # GIVEN the failure alarm, created on the emulator as the stack creates it, and evaluated locally
    alarm = local.alarm
    assert alarm.evaluated_locally(set())
    ensure_alarm(local.cloudwatch, alarm)
    assert evaluate_alarms(local.cloudwatch, [alarm], sqs=local.sqs) == {alarm.name: "OK"}  # no failure: FILL 0s
    # WHEN the schedule fires: Lambda accepts the event (the schedule succeeded) and the check raises in it
    assert runner(local, refused=False).fire() is True
    # THEN the function's Errors count it and the alarm goes to ALARM, with CloudWatch's reason
    reason = wait_for(lambda: alarm_reason(local, 1.0), "the failure alarm in ALARM at 1 failed check")
    assert reason.endswith("was greater than the threshold (0.0).")
    assert local.checks == [{}]  # one run: Lambda's own retries of an asynchronous invocation are not played
    # AND nothing was dead-lettered: Scheduler's part succeeded
    assert local.queue_depth() == "0"


def test_a_schedule_that_cannot_invoke_the_check_counts_target_errors_and_dead_letters_its_event(
    local: Local,
) -> None:
    ensure_alarm(local.cloudwatch, local.alarm)
    # WHEN the schedule's role may not invoke the check: three attempts (the first and two retries), all refused
    assert runner(local, refused=True).fire() is False
    # THEN the check never ran, the event is in the dead-letter queue, and the alarm adds 3 target errors (one per
    # attempt) and that dead letter
    assert local.queue_depth() == "1"
    wait_for(lambda: alarm_reason(local, 4.0), "the failure alarm in ALARM at 3 target errors + 1 dead letter")
    assert local.checks == []
