"""ECS's resource type of a template: each task definition, with the one container local mode runs."""

from __future__ import annotations

from collections.abc import Sequence

from servestack.local.cloudformation import Resolver, Resource, StackTemplate, TemplateError, as_list, logical_id_of
from servestack.local.scheduler import TaskDef


def read_task_definitions(
    template: StackTemplate, resolver: Resolver, resources: Sequence[Resource]
) -> dict[str, TaskDef]:
    r = resolver.resolve
    tasks: dict[str, TaskDef] = {}
    for res in resources:
        if res.type != "AWS::ECS::TaskDefinition":
            continue
        p = res.properties
        containers = as_list(p.get("ContainerDefinitions"))
        if len(containers) != 1:
            raise TemplateError(
                f"{template.name}: task definition {res.logical_id} has {len(containers)} containers; local "
                "mode runs one"
            )
        container = r(containers[0])
        argv = tuple(str(a) for a in [*container.get("EntryPoint", []), *container.get("Command", [])])
        environment = {str(e["Name"]): str(e["Value"]) for e in container.get("Environment", [])}
        tasks[res.logical_id] = TaskDef(
            res.logical_id,
            resolver.ref(res.logical_id),  # its ARN, as CloudFormation's Ref gives it
            argv,
            environment,
            logical_id_of(p.get("TaskRoleArn")),
            logical_id_of(p.get("ExecutionRoleArn")),
            str(container.get("Name", "")),
            str(container.get("Image", "")),
            tuple(str(a) for a in container.get("EntryPoint", [])),
            tuple(str(a) for a in container.get("Command", [])),
        )
    return tasks


# How local mode plays each of ECS's resource types (`local up --explain`).
ECS_TYPES: dict[str, str] = {
    "AWS::ECS::TaskDefinition": (
        "its container run from the image's staged build context (COPY, ENV, WORKDIR; the definition's entry "
        "point, command and environment), as its task role; RunTask and PassRole checked as the schedule's role"
    ),
}
