"""A batch deployment's part of `local up`'s plan: what `local run-batch` and `local status` read of its
schedule or its engine: transform job (the state file's entry), and the sample input seeded under its prefix.

Where a run reads and writes comes from what its target is given: a Lambda target's input (the scheduled
payload), an ECS target's task definition environment (`SERVESTACK_BATCH_*`: RunTask sends no payload), a
transform job's S3 locations."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from servestack.local.batch.seed import retire_seeded_input, seed_batch_input
from servestack.local.lambda_ import FunctionDef
from servestack.local.planning import PlanContext, ServicePlan, self_command
from servestack.local.scheduler import ScheduleDef, TaskDef
from servestack.monitor.setting import HANDLER as MONITOR_HANDLER

BATCH_SETTINGS_PREFIX = "SERVESTACK_BATCH_"  # the batch task's settings (servestack/adapters/batch.py)


class NamedRole(Protocol):
    @property
    def name(self) -> str: ...


class TransformContainer(Protocol):
    @property
    def environment(self) -> dict[str, str]: ...
    @property
    def model_data_url(self) -> str | None: ...


class ScheduledTransform(Protocol):
    """An engine: transform schedule's job (SageMaker's TransformDef, read by sagemaker/)."""

    @property
    def scheduler_role(self) -> str: ...
    @property
    def job(self) -> dict[str, Any]: ...
    @property
    def container(self) -> TransformContainer: ...
    @property
    def execution_role(self) -> str: ...
    @property
    def on_end(self) -> str | None: ...


class BatchStack(Protocol):
    """What a batch deployment's entry reads of a stack's topology."""

    @property
    def deployment(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def schedules(self) -> list[ScheduleDef]: ...
    @property
    def transforms(self) -> Sequence[ScheduledTransform]: ...
    @property
    def functions(self) -> dict[str, FunctionDef]: ...
    @property
    def roles(self) -> Mapping[str, NamedRole]: ...
    @property
    def tasks(self) -> dict[str, TaskDef]: ...


class BatchPlanner:
    """Seeds each batch deployment's sample input with `s3` (the developer's client), as `local up` always has."""

    name = "batch"

    def __init__(self, s3: Any) -> None:
        self.s3 = s3

    def plan(self, topology: BatchStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        entry = part.entry
        sample = context.sample
        # A `monitor:` block's drift check has its schedule too (in a batch deployment's group): not a run.
        checks = {f.arn for f in topology.functions.values() if f.handler == MONITOR_HANDLER}
        for schedule in topology.schedules:
            if schedule.target_arn in checks:
                continue
            payload = json.loads(schedule.input or "{}")
            task = topology.tasks.get(schedule.task or "")
            if task is not None:  # RunTask sends no payload: the run's settings are its task definition's
                payload = task_settings(task)
            entry |= {
                "schedule": f"{schedule.expression} {schedule.timezone}",
                "schedule_name": schedule.name,
                "target": schedule.target_arn,
                "schedule_role": schedule.role_arn,
                "input": payload,
            }
            if schedule.universal is not None:
                entry["universal"] = schedule.universal
            bucket, prefix = payload.get("bucket"), payload.get("input_prefix")
            if bucket and prefix and sample is not None and sample.is_file():
                self._seed(entry, bucket, prefix, sample)
                entry |= {"input_prefix": prefix, "output_prefix": payload.get("output_prefix")}
        for transform in topology.transforms:
            entry["transform"] = _transform_entry(topology, transform)
            source = transform.job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"]
            bucket, _, prefix = str(source).removeprefix("s3://").partition("/")
            output = str(transform.job["TransformOutput"]["S3OutputPath"]).removeprefix("s3://").partition("/")[2]
            entry |= {"input": {"bucket": bucket, "input_prefix": prefix, "output_prefix": output.rstrip("/") + "/"}}
            if sample is not None and sample.is_file():
                self._seed(entry, bucket, prefix, sample)
                entry |= {"input_prefix": prefix, "output_prefix": output.rstrip("/") + "/"}
        if topology.mode == "batch":
            part.commands.append(f"{self_command()} local run-batch {topology.deployment}")
        return part

    def _seed(self, entry: dict[str, Any], bucket: str, prefix: str, sample: Path) -> None:
        retire_seeded_input(self.s3, bucket, prefix)
        entry["seeded"] = seed_batch_input(self.s3, bucket, prefix, sample)


def task_settings(task: TaskDef) -> dict[str, str]:
    """A batch task's settings from its environment, as the scheduled payload names them (`bucket`,
    `input_prefix`...)."""
    return {
        key.removeprefix(BATCH_SETTINGS_PREFIX).lower(): value
        for key, value in task.environment.items()
        if key.startswith(BATCH_SETTINGS_PREFIX)
    }


def _transform_entry(topology: BatchStack, transform: ScheduledTransform) -> dict[str, Any]:
    """What `local run-batch` needs to run an engine: transform job: the request, the container's environment and
    model data URL (each job fetches it with the execution role, sagemaker/transform.py), the roles' names and the
    function run at the end."""
    on_end = topology.functions.get(transform.on_end or "")
    return {
        "job": transform.job,
        "environment": dict(transform.container.environment),
        "model_data_url": transform.container.model_data_url,
        "execution_role": topology.roles[transform.execution_role].name,
        "scheduler_role": transform.scheduler_role,
        "on_end": on_end.name if on_end is not None else None,
    }
