"""ECS's part of `local up`'s plan: each task definition of a stack, its container staged from its image, ready
for RunTask; a task runs when it is run, so it starts no child."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from servestack.local.ecs.tasks import TaskImageError, TaskLaunch, task_launch
from servestack.local.planning import PlanContext, PlanError, ServicePlan
from servestack.local.scheduler import TaskDef


class RoleOfStack(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def arn(self) -> str: ...


class TaskStack(Protocol):
    """What ECS reads of a stack's topology."""

    @property
    def stack(self) -> str: ...
    @property
    def tasks(self) -> dict[str, TaskDef]: ...
    @property
    def roles(self) -> Mapping[str, RoleOfStack]: ...


class EcsPlanner:
    """The task launches of every stack planned so far, by "<stack>/<task definition id>" (logical ids repeat
    across stacks)."""

    name = "ecs"

    def __init__(self) -> None:
        self.tasks: dict[str, TaskLaunch] = {}

    def plan(self, topology: TaskStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        for task in topology.tasks.values():
            try:
                launch = task_launch(topology, task, context.work / "cdk.out", context.work / "images")
            except TaskImageError as error:
                raise PlanError(str(error)) from None
            self.tasks[f"{topology.stack}/{task.logical_id}"] = launch
            part.entry["task"] = launch.to_dict()
        return part
