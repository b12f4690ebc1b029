"""A serverless deployment's CodeDeploy release as its template declares it: the deployment group, its traffic
shifting configuration (predefined or custom), its alarms and its BeforeAllowTraffic hook."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from servestack.local.cloudformation import Resolver, StackTemplate, logical_id_of

PREDEFINED = re.compile(r"^CodeDeployDefault\.Lambda(?:(Canary|Linear)(\d+)Percent(?:Every)?(\d+)Minutes?|AllAtOnce)$")


@dataclass(frozen=True)
class HookDef:
    name: str
    arn: str
    role_arn: str
    code: str
    environment: dict[str, str]
    timeout_sec: int
    memory_mib: int
    log_group: str


@dataclass(frozen=True)
class LambdaDeploymentDef:
    """One deployment group of compute platform Lambda, with the alias it releases."""

    application: str
    group: str
    group_arn: str
    service_role_arn: str
    function: str
    function_arn: str
    alias: str
    version: str  # the version the template publishes, which the release shifts to
    alarms: tuple[str, ...]
    steps: tuple[int, ...]  # the alias's weight on the new version after each shift, ending at 100
    interval_sec: float  # the wait after each shift but the last
    hook: HookDef | None


def _steps(template: StackTemplate, resolver: Resolver, raw: Any) -> tuple[tuple[int, ...], float]:
    """(weights after each shift, interval) of a deployment configuration: the template's own resource, or one
    of CodeDeploy's predefined Lambda configurations by name."""
    config_id = logical_id_of(raw)
    if config_id is not None and config_id in template.resources:
        routing = resolver.resolve(template.resources[config_id].properties.get("TrafficRoutingConfig") or {})
        kind = routing.get("Type", "AllAtOnce")
        if kind == "TimeBasedCanary":
            canary = routing["TimeBasedCanary"]
            return (int(canary["CanaryPercentage"]), 100), 60.0 * int(canary["CanaryInterval"])
        if kind == "TimeBasedLinear":
            linear = routing["TimeBasedLinear"]
            step = int(linear["LinearPercentage"])
            return tuple(min(100, step * n) for n in range(1, -(-100 // step) + 1)), 60.0 * int(
                linear["LinearInterval"]
            )
        return (100,), 0.0
    matched = PREDEFINED.match(str(resolver.resolve(raw) or "CodeDeployDefault.LambdaAllAtOnce"))
    if matched is None or matched.group(1) is None:
        return (100,), 0.0
    percent, minutes = int(matched.group(2)), int(matched.group(3))
    if matched.group(1) == "Canary":
        return (percent, 100), 60.0 * minutes
    return tuple(min(100, percent * n) for n in range(1, -(-100 // percent) + 1)), 60.0 * minutes


def read_lambda_deployments(template: StackTemplate, resolver: Resolver) -> list[LambdaDeploymentDef]:
    """The template's Lambda deployment groups and the aliases they release."""
    found = []
    resources = {lid: r for lid, r in template.resources.items() if resolver.exists(r)}
    for alias_id, alias in resources.items():
        raw_policy = template.body["Resources"][alias_id].get("UpdatePolicy") or {}
        update = raw_policy.get("CodeDeployLambdaAliasUpdate") if alias.type == "AWS::Lambda::Alias" else None
        group_id = logical_id_of((update or {}).get("DeploymentGroupName"))
        if update is None or group_id not in resources:
            continue
        group = resources[group_id].properties
        application = str(resolver.resolve(group["ApplicationName"]))
        group_name = resolver.physical_name(group_id)
        function = str(resolver.resolve(alias.properties["FunctionName"]))
        version_id = logical_id_of(alias.properties.get("FunctionVersion"))
        steps, interval = _steps(template, resolver, group.get("DeploymentConfigName"))
        hook_id = logical_id_of(update.get("BeforeAllowTrafficHook"))
        hook = None
        if hook_id in resources:
            p = resources[hook_id].properties
            hook = HookDef(
                resolver.physical_name(hook_id),
                resolver.get_att(hook_id, "Arn"),
                str(resolver.resolve(p["Role"])),
                str(resolver.resolve((p.get("Code") or {}).get("ZipFile", ""))),
                {
                    str(k): str(v)
                    for k, v in (resolver.resolve(p.get("Environment")) or {}).get("Variables", {}).items()
                },
                int(resolver.resolve(p.get("Timeout", 3))),
                int(resolver.resolve(p.get("MemorySize", 128))),
                str(
                    resolver.resolve((p.get("LoggingConfig") or {}).get("LogGroup"))
                    or f"/aws/lambda/{resolver.physical_name(hook_id)}"
                ),
            )
        found.append(
            LambdaDeploymentDef(
                application=application,
                group=group_name,
                group_arn=resolver.arn("codedeploy", f"deploymentgroup:{application}/{group_name}"),
                service_role_arn=str(resolver.resolve(group["ServiceRoleArn"])),
                function=resolver.physical_name(logical_id_of(alias.properties["FunctionName"]) or function),
                function_arn=resolver.get_att(logical_id_of(alias.properties["FunctionName"]) or "", "Arn"),
                alias=str(resolver.resolve(alias.properties["Name"])),
                version=resolver.get_att(version_id, "Version") if version_id else "$LATEST",
                alarms=tuple(
                    str(resolver.resolve(a["Name"])) for a in (group.get("AlarmConfiguration") or {}).get("Alarms", [])
                ),
                steps=steps,
                interval_sec=interval,
                hook=hook,
            )
        )
    return found


# How local mode plays each of CodeDeploy's resource types (`local up --explain`).
CODEDEPLOY_TYPES: dict[str, str] = {
    "AWS::CodeDeploy::Application": "`local deploy` of a serverless deployment: CodeDeploy's API on local up's port",
    "AWS::CodeDeploy::DeploymentConfig": "the release's steps and interval (`local deploy` of a serverless deployment)",
    "AWS::CodeDeploy::DeploymentGroup": "`local deploy` of a serverless deployment: the pre-traffic hook under its "
    "role, the alias shift and alarm reads under the service role (weights recorded: every version runs the same "
    "code locally)",
}
