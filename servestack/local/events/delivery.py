"""An event of a service local mode plays, delivered as EventBridge delivers it to the default event bus: every
rule of every deployment whose pattern matches counts one in its `TriggeredRules` metric (AWS/Events, with its
`RuleName`: https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-monitoring.html), put on the emulator's
CloudWatch; then each alarm that watches a matched rule is evaluated (servestack/local/cloudwatch/alarms.py).

The events are the services' own shapes: an ECS task's stop is "ECS Task State Change" with the fields of
https://docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs_task_events.html (`clusterArn`,
`taskDefinitionArn`, `lastStatus` STOPPED, `stopCode`, `stoppedReason`, each container's `exitCode`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from servestack.local.events.patterns import matches
from servestack.local.events.rules import RuleDef


def task_stopped_event(
    *,
    region: str,
    account: str,
    cluster_arn: str,
    task_arn: str,
    task_definition_arn: str,
    container: str,
    exit_code: int | None,
) -> dict[str, Any]:
    """ECS's event for a task whose one essential container exited with `exit_code` (None: it never started,
    `stopCode` TaskFailedToStart)."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    stopped: dict[str, Any] = {"name": container, "taskArn": task_arn, "lastStatus": "STOPPED"}
    if exit_code is not None:
        stopped["exitCode"] = exit_code
    started = exit_code is not None
    detail = {
        "clusterArn": cluster_arn,
        "taskArn": task_arn,
        "taskDefinitionArn": task_definition_arn,
        "launchType": "FARGATE",
        "lastStatus": "STOPPED",
        "desiredStatus": "STOPPED",
        "stopCode": "EssentialContainerExited" if started else "TaskFailedToStart",
        "stoppedReason": "Essential container in task exited" if started else "Task failed to start",
        "containers": [stopped],
        "stoppedAt": now,
    }
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "ECS Task State Change", "source": "aws.ecs",
        "account": account, "time": now, "region": region, "resources": [task_arn], "detail": detail,
    }  # fmt: skip


def rules_and_alarms(deployments: Mapping[str, Mapping[str, Any]]) -> tuple[list[RuleDef], list[Any]]:
    """Every played rule and evaluated alarm of the deployments' state entries (one account's default bus)."""
    from servestack.local.cloudwatch import AlarmDef

    rules = [RuleDef.from_dict(r) for entry in deployments.values() for r in entry.get("rules") or []]
    alarms = [AlarmDef.from_dict(a) for entry in deployments.values() for a in entry.get("alarms") or []]
    return rules, alarms


def deliver(
    event: Mapping[str, Any], rules: Iterable[RuleDef], alarms: Iterable[Any], cloudwatch: Any
) -> dict[str, str]:
    """Match the event against each enabled rule, count the matches, evaluate the alarms watching them; the state
    of each of those alarms, by name."""
    from servestack.local.cloudwatch import evaluate_alarms

    matched = [rule.name for rule in rules if rule.enabled and matches(rule.pattern, event)]
    for name in matched:
        cloudwatch.put_metric_data(
            Namespace="AWS/Events",
            MetricData=[{"MetricName": "TriggeredRules", "Dimensions": [{"Name": "RuleName", "Value": name}],
                         "Value": 1.0, "Unit": "Count"}],
        )  # fmt: skip
    watching = [alarm for alarm in alarms if alarm.watched_rules() & set(matched)]
    return evaluate_alarms(cloudwatch, watching)
