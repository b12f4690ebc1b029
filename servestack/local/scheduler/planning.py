"""EventBridge Scheduler's part of `local up`'s plan: the schedules of a stack, run in local up's own process."""

from __future__ import annotations

from typing import Protocol

from servestack.local.planning import PlanContext, ServicePlan
from servestack.local.scheduler.definitions import ScheduleDef


class ScheduleStack(Protocol):
    """What the scheduler reads of a stack's topology."""

    @property
    def schedules(self) -> list[ScheduleDef]: ...


class SchedulerPlanner:
    """The schedules of every stack planned so far (the runners' and GetSchedule's)."""

    name = "scheduler"

    def __init__(self) -> None:
        self.schedules: list[ScheduleDef] = []

    def plan(self, topology: ScheduleStack, context: PlanContext) -> ServicePlan:
        self.schedules += topology.schedules
        return ServicePlan()
