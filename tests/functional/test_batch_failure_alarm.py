"""A batch deployment's failure alarm as local mode plays it, on the emulator's CloudWatch: created as the template
declares it, fed by the failed-task rule's TriggeredRules when ECS's task state change event matches, evaluated as
CloudWatch evaluates it, and back to OK once a period passes without a failure."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from servestack.local.cloudwatch import AlarmDef, alarm_states, ensure_alarm, evaluate_alarms
from servestack.local.cloudwatch.alarms import alarm_of
from servestack.local.emulator.moto_server import EmbeddedEmulator, client_as
from servestack.local.events import RuleDef, deliver, task_stopped_event
from servestack.local.iam import DEVELOPER
from tests.unit.test_event_patterns import CLUSTER, FAILED_TASK

RULE = "servestack-weekly-BatchTaskFailed-0123456789AB"
# The failure alarm servestack/cdk/batch.py gives a Fargate deployment, resolved as local up resolves it.
FAILURE_ALARM: dict[str, Any] = {
    "AlarmName": "servestack-weekly-failures",
    "AlarmDescription": "servestack-weekly: a batch run failed",
    "ComparisonOperator": "GreaterThanThreshold",
    "EvaluationPeriods": 1,
    "Threshold": 0,
    "TreatMissingData": "notBreaching",
    "Metrics": [
        {"Expression": "FILL(failed, 0) + FILL(target_errors, 0) + FILL(dlq, 0)", "Id": "expr_1", "ReturnData": True},
        {"Id": "failed", "ReturnData": False, "MetricStat": {"Period": 300, "Stat": "Sum", "Metric": {
            "Namespace": "AWS/Events", "MetricName": "TriggeredRules",
            "Dimensions": [{"Name": "RuleName", "Value": RULE}]}}},
        {"Id": "target_errors", "ReturnData": False, "MetricStat": {"Period": 300, "Stat": "Sum", "Metric": {
            "Namespace": "AWS/Scheduler", "MetricName": "TargetErrorCount",
            "Dimensions": [{"Name": "ScheduleGroup", "Value": "servestack-weekly"}]}}},
        {"Id": "dlq", "ReturnData": False, "MetricStat": {"Period": 300, "Stat": "Maximum", "Metric": {
            "Namespace": "AWS/SQS", "MetricName": "ApproximateNumberOfMessagesVisible",
            "Dimensions": [{"Name": "QueueName", "Value": "servestack-weekly-dlq"}]}}},
    ],
}  # fmt: skip


@pytest.fixture
def cloudwatch() -> Iterator[Any]:
    """The developer's CloudWatch client on an emulator of its own (alarms and metrics are account-wide)."""
    emulator = EmbeddedEmulator()
    try:
        yield client_as("cloudwatch", emulator.url, DEVELOPER, "us-east-1")
    finally:
        emulator.stop()


def stopped(exit_code: int) -> dict[str, Any]:
    return task_stopped_event(
        region="us-east-1", account="123456789012", cluster_arn=CLUSTER, task_arn=f"{CLUSTER}/t", container="batch",
        task_definition_arn="arn:aws:ecs:us-east-1:123456789012:task-definition/weekly:1", exit_code=exit_code,
    )  # fmt: skip


def test_a_failed_task_raises_the_failure_alarm_and_a_quiet_period_clears_it(cloudwatch: Any) -> None:
    # GIVEN the deployment's failed-task rule and its failure alarm, created on the emulator as the stack creates it
    rule = RuleDef("BatchTaskFailed", RULE, FAILED_TASK, enabled=True)
    alarm = alarm_of(FAILURE_ALARM)
    assert AlarmDef.from_dict(alarm.to_dict()) == alarm  # as the state file carries it
    ensure_alarm(cloudwatch, alarm)
    assert evaluate_alarms(cloudwatch, [alarm]) == {alarm.name: "OK"}
    # WHEN a task of the deployment succeeds THEN the rule does not match, and the alarm stays quiet
    assert deliver(stopped(0), [rule], [alarm], cloudwatch) == {}
    # WHEN a task exits 66 (no input) THEN the rule's match is counted, and the alarm is in ALARM, with CloudWatch's
    # reason
    assert deliver(stopped(66), [rule], [alarm], cloudwatch) == {alarm.name: "ALARM"}
    (state,) = alarm_states(cloudwatch, [alarm.name])
    assert state["state"] == "ALARM"
    assert state["reason"].startswith("Threshold Crossed: 1 datapoint [1.0 (")
    assert state["reason"].endswith("was greater than the threshold (0.0).")
    # AND DescribeAlarms answers it as the template declares it
    (described,) = cloudwatch.describe_alarms(AlarmNames=[alarm.name])["MetricAlarms"]
    assert described["Threshold"] == 0.0
    assert {m["Id"] for m in described["Metrics"]} >= {"failed", "target_errors", "dlq"}
    # WHEN a period passes without a failure THEN the next evaluation puts it back to OK, as CloudWatch's would
    later = datetime.now(UTC) + timedelta(seconds=301)
    assert evaluate_alarms(cloudwatch, [alarm], now=later) == {alarm.name: "OK"}


def test_a_disabled_rule_feeds_nothing(cloudwatch: Any) -> None:
    rule = RuleDef("BatchTaskFailed", RULE, FAILED_TASK, enabled=False)
    alarm = alarm_of(FAILURE_ALARM)
    ensure_alarm(cloudwatch, alarm)
    assert deliver(stopped(1), [rule], [alarm], cloudwatch) == {}
    assert alarm_states(cloudwatch, [alarm.name])[0]["state"] == "OK"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"ComparisonOperator": "LessThanLowerOrGreaterThanUpperThreshold"}, "anomaly band"),
        ({"Metrics": [{"Expression": "SUM(METRICS())", "Id": "e", "ReturnData": True}]}, "not a sum of metrics"),
    ],
)
def test_an_alarm_local_mode_cannot_evaluate_is_refused_not_guessed(change: dict[str, Any], why: str) -> None:
    from servestack.local.cloudwatch import AlarmNotEvaluated

    with pytest.raises(AlarmNotEvaluated, match=why):
        alarm_of(FAILURE_ALARM | change)
