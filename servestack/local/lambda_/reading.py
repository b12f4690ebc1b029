"""Lambda's resource types of a template: functions (with their versions and aliases), the permissions that
become their resource policies, and the SQS event source mappings."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servestack.local.cloudformation import (
    PARTITION,
    Resolver,
    Resource,
    StackTemplate,
    TemplateError,
    as_list,
    file_asset_sources,
    logical_id_of,
    str_map,
)
from servestack.local.lambda_.definitions import EventSourceMappingDef, FunctionDef


@dataclass
class LambdaResources:
    functions: dict[str, FunctionDef] = field(default_factory=dict)
    versioned: set[str] = field(default_factory=set)  # functions the template publishes a version of
    mappings: list[EventSourceMappingDef] = field(default_factory=list)
    permissions: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (function ARN, its policy doc)


def read_functions(
    template: StackTemplate, resolver: Resolver, resources: Sequence[Resource], roles: Collection[str]
) -> dict[str, FunctionDef]:
    """The functions of the template, each with the role (of `roles`, logical ids) it runs as."""
    r = resolver.resolve
    name = resolver.physical_name
    functions: dict[str, FunctionDef] = {}
    sources = file_asset_sources(template.path.parent)
    for res in resources:
        p = res.properties
        if res.type == "AWS::Lambda::Function":
            variables = (r(p.get("Environment")) or {}).get("Variables", {})
            role_id = logical_id_of(p.get("Role"))
            if role_id is None or role_id not in roles:
                raise TemplateError(
                    f"{template.name}: function {res.logical_id} has a role local mode cannot find ({p.get('Role')})"
                )
            reserved = p.get("ReservedConcurrentExecutions")
            image = p.get("PackageType") == "Image"
            # A container image's handler is its command (ImageConfig.Command; the image's CMD when absent, read
            # when the image is staged)
            command = (r(p.get("ImageConfig")) or {}).get("Command") or [""]
            functions[res.logical_id] = FunctionDef(
                res.logical_id,
                name(res.logical_id),
                resolver.get_att(res.logical_id, "Arn"),
                str(command[0]) if image else str(r(p["Handler"])),
                str_map(variables),
                int(r(p.get("Timeout", 3))),
                int(r(p.get("MemorySize", 128))),
                int(r(reserved)) if reserved is not None else None,
                role_id,
                runtime=str(r(p.get("Runtime", ""))),
                log_group=str(
                    r((p.get("LoggingConfig") or {}).get("LogGroup") or f"/aws/lambda/{name(res.logical_id)}")
                ),
                code_dir=None if image else _code_dir(p.get("Code") or {}, sources),
                image_uri=str(r((p.get("Code") or {}).get("ImageUri"))) if image else None,
                architecture=str((r(p.get("Architectures")) or ["x86_64"])[0]),
            )
    return functions


def _code_dir(code: dict[str, Any], sources: dict[str, Path]) -> Path | None:
    """The folder a function's code asset is made from (its `S3Key` among the assembly's assets); None for
    inline code, or code that is not an asset of this assembly (a bucket of its own), which local mode cannot
    run (the Lambda planner says so)."""
    key = code.get("S3Key")
    return sources.get(key) if isinstance(key, str) else None


def read_lambda(
    template: StackTemplate, resolver: Resolver, resources: Sequence[Resource], functions: dict[str, FunctionDef]
) -> LambdaResources:
    """What the template says of its `functions` beyond themselves: versions, aliases, permissions and mappings."""
    r = resolver.resolve
    found = LambdaResources(dict(functions))
    for res in resources:
        p = res.properties
        if res.type == "AWS::Lambda::Version":
            function_id = logical_id_of(p["FunctionName"])
            if function_id is not None:
                found.versioned.add(function_id)
        elif res.type == "AWS::Lambda::Alias":
            function_id = logical_id_of(p["FunctionName"])
            if function_id in found.functions:
                f = found.functions[function_id]
                found.functions[function_id] = replace(f, aliases=(*f.aliases, str(r(p["Name"]))))
        elif res.type == "AWS::Lambda::Permission":
            target = str(r(p["FunctionName"]))
            function = next(
                (f for f in found.functions.values() if target in (f.name, f.arn) or target.startswith(f.arn + ":")),
                None,
            )
            if function is not None:
                statement: dict[str, Any] = {
                    "Effect": "Allow",
                    "Action": str(r(p["Action"])),
                    "Resource": target,
                    "Principal": _permission_principal(str(r(p["Principal"]))),
                }
                conditions: dict[str, Any] = {}
                if "SourceArn" in p:
                    conditions["ArnLike"] = {"AWS:SourceArn": r(p["SourceArn"])}
                if "SourceAccount" in p:
                    conditions["StringEquals"] = {"AWS:SourceAccount": r(p["SourceAccount"])}
                if conditions:
                    statement["Condition"] = conditions
                document = {"Version": "2012-10-17", "Statement": [statement]}
                found.permissions.append((function.arn, document))
        elif res.type == "AWS::Lambda::EventSourceMapping":
            function_id = logical_id_of(p["FunctionName"])
            if function_id is None or function_id not in found.functions:
                function_name = str(r(p["FunctionName"]))
                function_id = next(
                    (f.logical_id for f in found.functions.values() if function_name in (f.name, f.arn)), None
                )
            if function_id is None:
                raise TemplateError(f"{template.name}: event source mapping {res.logical_id} names no function")
            scaling = r(p.get("ScalingConfig")) or {}
            found.mappings.append(
                EventSourceMappingDef(
                    res.logical_id,
                    function_id,
                    str(r(p["EventSourceArn"])),
                    int(r(p.get("BatchSize", 10))),
                    int(r(p.get("MaximumBatchingWindowInSeconds", 0))),
                    "ReportBatchItemFailures" in as_list(r(p.get("FunctionResponseTypes"))),
                    int(scaling["MaximumConcurrency"]) if "MaximumConcurrency" in scaling else None,
                    bool(r(p.get("Enabled", True))),
                )
            )
    return found


def _permission_principal(principal: str) -> dict[str, str]:
    if principal.endswith(".amazonaws.com"):
        return {"Service": principal}
    if principal.isdigit():
        return {"AWS": f"arn:{PARTITION}:iam::{principal}:root"}
    return {"AWS": principal}


# How local mode plays each of Lambda's resource types (`local up --explain`).
LAMBDA_TYPES: dict[str, str] = {
    "AWS::Lambda::Function": (
        "handler run in a local process from its code asset (what its bundle carries), on the packages its bundle "
        "installs, built for this machine's Python and platform (Lambda's: CPython 3.12 on Amazon Linux), "
        "nothing else importable but the runtime's standard library and boto3; a container-image function "
        "(PackageType Image) from its image's files as its Dockerfile places them (/var/task), on the packages "
        "its RUN steps install, its base image and runtime interface client being this machine's Python and "
        "local mode's runner, its image not pulled from ECR: the template's handler, environment, timeout, memory"
    ),
    "AWS::Lambda::Version": "accepted as an Invoke qualifier (local mode runs the code asset of the template)",
    "AWS::Lambda::Alias": "accepted as an Invoke qualifier (local mode runs the code asset of the template)",
    "AWS::Lambda::EventSourceMapping": "SQS poller: batch size, window, partial failures, maximum concurrency",
    "AWS::Lambda::Permission": "resource policy: checked for the HTTP API and schedule that invoke the function",
}
