"""The SageMaker resources of a template, as local up runs them: endpoints, their variants and inference
components, the models' containers, and the Batch Transform jobs schedules create."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ContainerDef:
    image: str
    environment: dict[str, str]
    model_data_url: str | None
    mode: str  # SingleModel | MultiModel


@dataclass(frozen=True)
class VariantDef:
    name: str
    model_name: str | None  # None: the variant hosts inference components
    container: ContainerDef | None
    execution_role: str | None  # role logical id (the model's)
    weight: float
    instance_type: str | None
    instance_count: int
    serverless: dict[str, Any] | None


@dataclass(frozen=True)
class ComponentDef:
    """An inference component: a model placed on an endpoint's variant, invoked by its name."""

    logical_id: str
    name: str
    arn: str
    variant: str
    model_name: str
    container: ContainerDef
    execution_role: str  # role logical id (the model's)
    copies: int
    compute: dict[str, Any]  # ComputeResourceRequirements, as the template gives them
    deployment_config: dict[str, Any] | None


@dataclass(frozen=True)
class EndpointDef:
    logical_id: str
    name: str
    arn: str
    variants: tuple[VariantDef, ...]
    shadow_variants: tuple[VariantDef, ...]
    async_config: dict[str, Any] | None
    deployment_config: dict[str, Any] | None
    components: tuple[ComponentDef, ...] = ()
    execution_role: str | None = None  # the endpoint config's (role logical id): component endpoints need one
    data_capture: dict[str, Any] | None = None  # the endpoint config's DataCaptureConfig, resolved


@dataclass(frozen=True)
class TransformDef:
    """An engine: transform schedule's job, as `servestack local run-batch` (or the local scheduler) runs it:
    the CreateTransformJob request the schedule sends, the model's container and execution role, and the
    function the job state change rule runs when the job ends."""

    schedule: str  # the schedule's name
    scheduler_role: str  # the schedule's role ARN (creates the job, passes the execution role)
    job: dict[str, Any]  # the request; TransformJobName still holds <aws.scheduler.execution-id>
    container: ContainerDef
    execution_role: str  # role logical id
    on_end: str | None  # function logical id
