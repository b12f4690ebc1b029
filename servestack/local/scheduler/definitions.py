"""The EventBridge Scheduler schedules of a template, and the ECS task definitions their targets run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleDef:
    logical_id: str
    name: str
    expression: str
    timezone: str
    enabled: bool
    target_arn: str
    role_arn: str
    input: str | None
    retry_attempts: int
    maximum_event_age_sec: int
    dead_letter_arn: str | None
    task: str | None = None  # an ECS target's task definition (logical id); None for a Lambda target
    # A universal target's SDK action ("sagemaker:createTransformJob" for engine: transform, which the local
    # scheduler makes as the schedule's role; any other action is reported, not run).
    universal: str | None = None
    group: str = "default"  # its schedule group: its ARN, GetSchedule's groupName, the group's metrics


@dataclass(frozen=True)
class TaskDef:
    """An ECS task definition's one container, as local mode runs it: a process."""

    logical_id: str
    arn: str
    argv: tuple[str, ...]
    environment: dict[str, str]
    task_role: str | None  # role logical id
    execution_role: str | None = None  # role logical id (ECS pulls the image and writes logs with it)
    container: str = ""  # the container definition's name
    image: str = ""  # its image URI (an image asset of the assembly: servestack/local/ecs/tasks.py runs it)
    entry_point: tuple[str, ...] = ()  # replaces the image's ENTRYPOINT when given
    command: tuple[str, ...] = ()  # replaces the image's CMD when given
