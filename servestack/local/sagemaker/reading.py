"""The SageMaker resources of a template, read the way `local up` runs them: each endpoint with its config's
variants, shadow variants and inference components, each model's container, and the Batch Transform jobs that
schedules create."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from servestack.local.cloudformation import (
    Resolver,
    Resource,
    StackTemplate,
    TemplateError,
    as_list,
    logical_id_of,
    str_map,
)
from servestack.local.sagemaker.definitions import ComponentDef, ContainerDef, EndpointDef, TransformDef, VariantDef
from servestack.local.scheduler import ScheduleDef


def _container(resolver: Resolver, model: Resource) -> tuple[ContainerDef, str]:
    p = model.properties
    containers = as_list(p.get("Containers"))
    if "PrimaryContainer" not in p and len(containers) != 1:
        raise TemplateError(
            f"{resolver.template.name}: model {model.logical_id} has {len(containers)} containers; local mode runs "
            "one container per model"
        )
    raw = resolver.resolve(p.get("PrimaryContainer") or containers[0])
    role = logical_id_of(p.get("ExecutionRoleArn"))
    if role is None:
        raise TemplateError(f"{resolver.template.name}: model {model.logical_id} has no execution role in the stack")
    data = raw.get("ModelDataUrl") or ((raw.get("ModelDataSource") or {}).get("S3DataSource") or {}).get("S3Uri")
    container = ContainerDef(
        str(raw.get("Image", "")), str_map(raw.get("Environment")), str(data) if data else None,
        str(raw.get("Mode", "SingleModel")),
    )  # fmt: skip
    return container, role


# What SageMaker refuses when an endpoint hosts inference components (docs/sagemaker-strictness.md).
NOT_A_COMPONENT_ENDPOINT = (
    "Inference Components are not supported in this Endpoint. Please make sure this endpoint can deploy inference "
    "components."
)
ZERO_COPIES_AT_CREATION = "Inference components copy count an integer larger than 0"


TRANSFORM_JOB_ENDED = "SageMaker Transform Job State Change"


def read_transforms(
    template: StackTemplate, resolver: Resolver, resources: list[Resource], schedules: list[ScheduleDef]
) -> list[TransformDef]:
    """Each schedule whose universal target is CreateTransformJob, with the model it names and the function
    SageMaker's job state change event runs."""
    models = {resolver.physical_name(m.logical_id): m for m in resources if m.type == "AWS::SageMaker::Model"}
    on_end: str | None = None
    for rule in resources:
        if rule.type != "AWS::Events::Rule":
            continue
        pattern = resolver.resolve(rule.properties.get("EventPattern") or {})
        if TRANSFORM_JOB_ENDED in as_list(pattern.get("detail-type")):
            targets = as_list(rule.properties.get("Targets"))
            on_end = logical_id_of(targets[0].get("Arn")) if targets else None
    found: list[TransformDef] = []
    for schedule in schedules:
        if schedule.universal != "sagemaker:createTransformJob":
            continue
        job = json.loads(schedule.input or "{}")
        model = models.get(str(job.get("ModelName")))
        if model is None:
            raise TemplateError(
                f"{template.name}: schedule {schedule.logical_id} creates transform jobs of model "
                f"{job.get('ModelName')!r}, which is not in the stack"
            )
        container, role = _container(resolver, model)
        found.append(TransformDef(schedule.name, schedule.role_arn, job, container, role, on_end))
    return found


def read_endpoint(
    template: StackTemplate, resolver: Resolver, endpoint: Resource, resources: list[Resource]
) -> EndpointDef:
    config_id = logical_id_of(endpoint.properties["EndpointConfigName"])
    config = template.resources.get(config_id or "")
    if config is None:
        raise TemplateError(f"{template.name}: endpoint {endpoint.logical_id} has no endpoint config in the stack")
    models = {resolver.physical_name(m.logical_id): m for m in resources if m.type == "AWS::SageMaker::Model"}

    def model_of(model_name: str, who: str) -> Resource:
        model = models.get(model_name)
        if model is None:
            raise TemplateError(f"{template.name}: {who} names unknown model {model_name}")
        return model

    def variant(raw: Mapping[str, Any]) -> VariantDef:
        resolved = resolver.resolve(dict(raw))
        container, role, model_name = None, None, None
        if "ModelName" in raw:
            model_name = str(resolver.resolve(raw["ModelName"]))
            container, role = _container(resolver, model_of(model_name, f"variant {raw.get('VariantName')}"))
        elif "ServerlessConfig" in resolved:
            raise TemplateError(
                f"{template.name}: variant {resolved.get('VariantName')} of {endpoint.logical_id} is serverless and "
                "names no model: SageMaker places inference components on instance-based variants only"
            )
        return VariantDef(
            str(resolved["VariantName"]),
            model_name,
            container,
            role,
            float(resolved.get("InitialVariantWeight", 1.0)),
            resolved.get("InstanceType"),
            int(resolved.get("InitialInstanceCount", 1)),
            resolved.get("ServerlessConfig"),
        )

    p = config.properties
    variants = tuple(variant(v) for v in as_list(p.get("ProductionVariants")))
    name = resolver.physical_name(endpoint.logical_id)
    execution_role = logical_id_of(p.get("ExecutionRoleArn"))
    if execution_role not in template.resources:  # absent, or AWS::NoValue, or a role outside the stack
        execution_role = None
    if any(v.model_name is None for v in variants) and execution_role is None:
        # CreateEndpointConfig refuses a config for inference components without one (stdapi-ai/stdapi.ai #43).
        raise TemplateError(
            f"{template.name}: endpoint config {config.logical_id} has a variant without ModelName (for inference "
            "components) but no ExecutionRoleArn in the stack; SageMaker requires one for such a config"
        )

    def component(res: Resource) -> ComponentDef:
        props = res.properties
        resolved = resolver.resolve(dict(props))
        who = f"inference component {res.logical_id}"
        wanted = str(resolved.get("VariantName") or variants[0].name)
        host = next((v for v in variants if v.name == wanted), None)
        if host is None:
            raise TemplateError(
                f"{template.name}: {who} names variant {wanted}, not one of {name}'s "
                f"({', '.join(v.name for v in variants)})"
            )
        if host.model_name is not None:
            raise TemplateError(f"{template.name}: {who} on variant {wanted} of {name}: {NOT_A_COMPONENT_ENDPOINT}")
        copies = int((resolved.get("RuntimeConfig") or {}).get("CopyCount", 1))
        if copies < 1:
            raise TemplateError(f"{template.name}: {who}: {ZERO_COPIES_AT_CREATION} (CopyCount {copies})")
        specification = props.get("Specification") or {}
        if "ModelName" not in specification:
            raise TemplateError(f"{template.name}: {who} names no SageMaker model; local mode runs a model's container")
        model_name = str(resolver.resolve(specification["ModelName"]))
        container, role = _container(resolver, model_of(model_name, who))
        component_name = resolver.physical_name(res.logical_id)
        return ComponentDef(
            res.logical_id,
            component_name,
            resolver.ref(res.logical_id),
            wanted,
            model_name,
            container,
            role,
            copies,
            dict(resolved.get("Specification", {}).get("ComputeResourceRequirements") or {}),
            resolved.get("DeploymentConfig"),
        )

    endpoint_arn = resolver.ref(endpoint.logical_id)
    components = tuple(
        component(r)
        for r in resources
        if r.type == "AWS::SageMaker::InferenceComponent"
        and str(resolver.resolve(r.properties.get("EndpointName") or r.properties.get("EndpointArn")))
        in (name, endpoint_arn)
    )
    return EndpointDef(
        endpoint.logical_id,
        name,
        endpoint_arn,
        variants,
        tuple(variant(v) for v in as_list(p.get("ShadowProductionVariants"))),
        resolver.resolve(p["AsyncInferenceConfig"]) if "AsyncInferenceConfig" in p else None,
        resolver.resolve(endpoint.properties["DeploymentConfig"])
        if "DeploymentConfig" in endpoint.properties
        else None,
        components,
        execution_role,
        resolver.resolve(p["DataCaptureConfig"]) if "DataCaptureConfig" in p else None,
    )


# How local mode plays each of SageMaker's resource types (`local up --explain`).
SAGEMAKER_TYPES: dict[str, str] = {
    "AWS::SageMaker::Model": "its image run from the staged build context, its model data fetched with its role",
    "AWS::SageMaker::EndpointConfig": "variants, weights, shadow, serverless and async configuration, model mode",
    "AWS::SageMaker::Endpoint": "local endpoint behind the SageMaker Runtime front",
    "AWS::SageMaker::InferenceComponent": "its model's container run locally, invoked by InferenceComponentName; "
    "copies set by UpdateInferenceComponentRuntimeConfig (0 stops it)",
}
