"""EventBridge Scheduler, as `local up` plays it: schedule expressions, the schedules of the templates and their
targets (Lambda functions, ECS tasks, Batch Transform jobs), and its read API.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.scheduler.api import SchedulerApi
    from servestack.local.scheduler.definitions import ScheduleDef, TaskDef
    from servestack.local.scheduler.planning import SchedulerPlanner
    from servestack.local.scheduler.reading import SCHEDULER_TYPES, read_schedules, universal_action
    from servestack.local.scheduler.schedules import ScheduleRunner, invoke_as_schedule_role, send_dead_letter
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "SCHEDULER_TYPES",
    "ScheduleDef",
    "ScheduleRunner",
    "SchedulerApi",
    "SchedulerPlanner",
    "TaskDef",
    "invoke_as_schedule_role",
    "read_schedules",
    "send_dead_letter",
    "universal_action",
]
