"""ECS, as a Fargate batch deployment uses it: RunTask of the templates' task definitions (authorized as the
caller's role, with the PassRole of the task's roles), and the task's container run from its image's staged
build context.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.ecs.planning import EcsPlanner
    from servestack.local.ecs.reading import ECS_TYPES, read_task_definitions
    from servestack.local.ecs.tasks import (
        EcsRunTask,
        TaskImageError,
        TaskLaunch,
        report_task_stopped,
        run_as_schedule,
        run_task_refusal,
        task_endpoints,
        task_launch,
        task_process,
    )
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "ECS_TYPES",
    "EcsPlanner",
    "EcsRunTask",
    "TaskImageError",
    "TaskLaunch",
    "read_task_definitions",
    "report_task_stopped",
    "run_as_schedule",
    "run_task_refusal",
    "task_endpoints",
    "task_launch",
    "task_process",
]
