"""Lambda's part of `local up`'s plan: one execution environment (a child) per function of a stack, and the SQS
event source mappings the Lambda service polls for."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Protocol

from servestack.local.cloudformation import TemplateError
from servestack.local.hosting import installed
from servestack.local.iam import Credentials
from servestack.local.lambda_.definitions import EventSourceMappingDef, FunctionDef
from servestack.local.lambda_.runner import PACKAGES_ENV, runner_command
from servestack.local.lambda_.service import HostedFunction
from servestack.local.planning import Child, PlanContext, ServicePlan, map_paths

LAMBDA_TASK_ROOT = "/var/task"
REQUIREMENTS_FILE = "requirements.txt"  # what a staged code asset lists of its bundle's packages (cdk/bundling.py)
INLINE_HANDLER = "index.handler"  # inline code (the CodeDeploy pre-traffic hook): run only by CodeDeploy


class LambdaStack(Protocol):
    """What Lambda reads of a stack's topology."""

    @property
    def deployment(self) -> str: ...
    @property
    def functions(self) -> dict[str, FunctionDef]: ...
    @property
    def versioned(self) -> set[str]: ...
    @property
    def mappings(self) -> list[EventSourceMappingDef]: ...


def lambda_environment(function: FunctionDef, region: str, task_root: Path) -> dict[str, str]:
    """What the Lambda runtime adds to a function's own variables (Lambda's reserved environment variables)."""
    return {
        "AWS_LAMBDA_FUNCTION_NAME": function.name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_mib),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function.name}",
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{function.runtime}",
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "LAMBDA_TASK_ROOT": str(task_root),
        "_HANDLER": function.handler,
    }


def shipped_packages(task_root: Path, function: str) -> Path | None:
    """The packages the function's bundle installs (its code asset's requirements.txt), installed for this
    machine once per list; None for code that lists none (a bundle built with its packages inside)."""
    listed = task_root / REQUIREMENTS_FILE
    if not listed.is_file() or _bundled(task_root):
        return None
    return installed(listed.read_text(encoding="utf-8"), "target", what=f"function {function}")


def image_function(function: FunctionDef, context: PlanContext) -> tuple[Path, Path | None, str]:
    """A container-image function as local mode runs it: its image's files staged from the build context in
    cdk.out (its /var/task is the task root), the packages its RUN steps install built for this machine, and its
    handler (the function's command, else the image's CMD)."""
    assert function.image_uri is not None
    staged = context.stage_image(function.image_uri)
    if staged is None:
        raise TemplateError(f"function {function.logical_id}: {function.image_uri} is not an image asset of cdk.out")
    handler = function.handler or (staged.cmd[0] if staged.cmd else "")
    if not handler:
        raise TemplateError(f"function {function.logical_id}: neither ImageConfig.Command nor the image's CMD")
    packages = (
        installed(staged.requirements, "target", what=f"function {function.name}") if staged.requirements else None
    )
    return staged.root / "var" / "task", packages, handler


def _bundled(task_root: Path) -> bool:
    """Whether the code asset is a whole bundle (a synth that bundled): its packages are inside it."""
    return any(task_root.glob("*.dist-info"))


class LambdaPlanner:
    """The functions of every stack planned so far (the Invoke API's), and their mappings (the pollers')."""

    name = "lambda"

    def __init__(self) -> None:
        self.functions: list[HostedFunction] = []
        self.mappings: list[tuple[EventSourceMappingDef, FunctionDef, Credentials]] = []

    def plan(self, topology: LambdaStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        hosted: dict[str, HostedFunction] = {}
        for function in topology.functions.values():
            if function.handler == INLINE_HANDLER:
                continue
            if function.image_uri is not None:
                task_root, packages, handler = image_function(function, context)
                function = dataclasses.replace(function, handler=handler)
            elif function.code_dir is None or not function.code_dir.is_dir():
                raise TemplateError(
                    f"function {function.logical_id} ({function.handler}): its code is not a folder asset of the "
                    f"cloud assembly ({function.code_dir}), so local mode cannot run it; run with --resynth"
                )
            else:
                task_root = function.code_dir
                packages = shipped_packages(task_root, function.name)
            port = context.free_port()
            config = context.run_dir / f"{function.name}.json"
            config.write_text(json.dumps({
                "name": function.name, "handler": function.handler,
                "timeout_sec": function.timeout_sec, "memory_mib": function.memory_mib,
            }))  # fmt: skip
            credentials = context.credentials[function.role]
            env = (
                context.env_base
                | context.service_endpoints
                | lambda_environment(function, context.region, task_root)
                # /var/task is the function's code asset: the sources its bundle carries (servestack's runtime,
                # the entry points, the deployment's own model packages), as the app staged them.
                | map_paths(function.environment, {LAMBDA_TASK_ROOT: str(task_root)})
                | ({PACKAGES_ENV: str(packages)} if packages is not None else {})
                | credentials.environment()
            )
            url = f"http://127.0.0.1:{port}"
            child = Child(
                f"{topology.deployment}/{function.logical_id}", runner_command(config, port), env, f"{url}/",
                cwd=task_root,
            )  # fmt: skip
            child.sinks.append(context.log_shipper(child.name, function.log_group, credentials, None))
            part.log_groups[function.name] = function.log_group
            part.children.append(child)
            hosted[function.logical_id] = HostedFunction(function, url, function.logical_id in topology.versioned)
        self.functions += hosted.values()
        part.entry["lambda_functions"] = {f.definition.logical_id: f.name for f in hosted.values()}
        for mapping in topology.mappings:
            function = topology.functions[mapping.function]
            self.mappings.append((mapping, function, context.credentials[function.role]))
        return part
