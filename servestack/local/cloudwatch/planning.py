"""CloudWatch's part of `local up`'s plan: the alarms of a stack that watch a rule local mode plays or metrics its
code publishes, created on the emulator, and named in the deployment's entry of the state file (what
`local run-batch`, the scheduler and `local status` evaluate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from servestack.local.cloudwatch.alarms import AlarmDef, ensure_alarm
from servestack.local.planning import PlanContext, ServicePlan


class PlayedRule(Protocol):
    """What CloudWatch reads of an EventBridge rule that local mode plays: its name, which an alarm's
    `TriggeredRules` metric names."""

    @property
    def name(self) -> str: ...


class AlarmStack(Protocol):
    """What CloudWatch reads of a stack's topology."""

    @property
    def alarms(self) -> list[AlarmDef]: ...
    @property
    def rules(self) -> Sequence[PlayedRule]: ...


class AlarmsPlanner:
    """Creates each evaluated alarm with `cloudwatch` (the developer's client on the emulator), as CloudFormation
    creates the stack's alarms."""

    name = "cloudwatch"

    def __init__(self, cloudwatch: Any) -> None:
        self.cloudwatch = cloudwatch

    def plan(self, topology: AlarmStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        played = {rule.name for rule in topology.rules}
        evaluated = [alarm for alarm in topology.alarms if alarm.evaluated_locally(played)]
        for alarm in evaluated:
            ensure_alarm(self.cloudwatch, alarm)
        if evaluated:
            part.entry["alarms"] = [alarm.to_dict() for alarm in evaluated]
        return part
