"""EventBridge Scheduler's resource type of a template: each schedule with its target."""

from __future__ import annotations

from collections.abc import Sequence

from servestack.local.cloudformation import Resolver, Resource, logical_id_of
from servestack.local.scheduler.definitions import ScheduleDef

UNIVERSAL_TARGET = ":scheduler:::aws-sdk:"


def universal_action(target_arn: str) -> str | None:
    """`service:action` of a Scheduler universal target ARN (`arn:aws:scheduler:::aws-sdk:service:action`)."""
    _, found, action = target_arn.partition(UNIVERSAL_TARGET)
    return action if found else None


def read_schedules(resolver: Resolver, resources: Sequence[Resource]) -> list[ScheduleDef]:
    r = resolver.resolve
    schedules: list[ScheduleDef] = []
    for res in resources:
        if res.type != "AWS::Scheduler::Schedule":
            continue
        p = res.properties
        raw_target = p["Target"]
        task_id = logical_id_of((raw_target.get("EcsParameters") or {}).get("TaskDefinitionArn"))
        target = r(raw_target)
        retry = target.get("RetryPolicy") or {}
        schedules.append(
            ScheduleDef(
                res.logical_id,
                resolver.physical_name(res.logical_id),
                str(r(p["ScheduleExpression"])),
                str(r(p.get("ScheduleExpressionTimezone", "UTC"))),
                str(r(p.get("State", "ENABLED"))) == "ENABLED",
                str(target["Arn"]),
                str(target["RoleArn"]),
                target.get("Input"),
                int(retry.get("MaximumRetryAttempts", 185)),
                int(retry.get("MaximumEventAgeInSeconds", 86_400)),
                (target.get("DeadLetterConfig") or {}).get("Arn"),
                task_id,
                universal_action(str(target["Arn"])),
                str(r(p.get("GroupName") or "default")),
            )
        )
    return schedules


# How local mode plays each of EventBridge Scheduler's resource types (`local up --explain`).
SCHEDULER_TYPES: dict[str, str] = {
    "AWS::Scheduler::Schedule": "local scheduler: expression, time zone, input, retries, DLQ; each run (and "
    "`local run-batch`) started as its role; GetSchedule on local up's AWS API port",
    "AWS::Scheduler::ScheduleGroup": "the group its schedules are in: their ARNs, GetSchedule's groupName, the "
    "schedule ARN a dead letter carries",
}
