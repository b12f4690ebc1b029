"""Local CodeDeploy's reading of the templates (the group, the alias it releases, the hook, the steps of its
configuration) and its API's refusals; Scheduler's GetSchedule as the enforcer describes it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from servestack.local.cloudformation.templates import LocalValues, Resolver, StackTemplate
from servestack.local.codedeploy.definitions import read_lambda_deployments
from servestack.local.codedeploy.deployments import LocalCodeDeploy, Release
from servestack.local.iam.access import LocalAccess
from servestack.local.iam.operations import Check, Where, describe
from tests.unit.test_iam_operations import sent

GROUP = {"Ref": "Group"}


def template(tmp_path: Path, config: Any) -> StackTemplate:
    resources: dict[str, Any] = {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {}}},
        "HookRole": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {}}},
        "Function": {"Type": "AWS::Lambda::Function", "Properties": {
            "FunctionName": "api", "Role": {"Fn::GetAtt": ["HookRole", "Arn"]}, "Handler": "h.h",
        }},
        "Version": {"Type": "AWS::Lambda::Version", "Properties": {"FunctionName": {"Ref": "Function"}}},
        "Hook": {"Type": "AWS::Lambda::Function", "Properties": {
            "Role": {"Fn::GetAtt": ["HookRole", "Arn"]}, "Handler": "index.handler", "Timeout": 120,
            "Code": {"ZipFile": "def handler(event, context):\n    return None\n"},
            "Environment": {"Variables": {"TARGET_FUNCTION": {"Ref": "Version"}}},
        }},
        "App": {"Type": "AWS::CodeDeploy::Application", "Properties": {"ComputePlatform": "Lambda"}},
        "Group": {"Type": "AWS::CodeDeploy::DeploymentGroup", "Properties": {
            "ApplicationName": {"Ref": "App"}, "ServiceRoleArn": {"Fn::GetAtt": ["Role", "Arn"]},
            "DeploymentConfigName": config, "AlarmConfiguration": {"Alarms": [{"Name": "errors"}], "Enabled": True},
        }},
        "Live": {"Type": "AWS::Lambda::Alias", "Properties": {
            "FunctionName": {"Ref": "Function"}, "Name": "live",
            "FunctionVersion": {"Fn::GetAtt": ["Version", "Version"]},
        }, "UpdatePolicy": {"CodeDeployLambdaAliasUpdate": {
            "ApplicationName": {"Ref": "App"}, "DeploymentGroupName": GROUP, "BeforeAllowTrafficHook": {"Ref": "Hook"},
        }}},
        "Config": {"Type": "AWS::CodeDeploy::DeploymentConfig", "Properties": {"TrafficRoutingConfig": {
            "Type": "TimeBasedLinear", "TimeBasedLinear": {"LinearInterval": 2, "LinearPercentage": 30},
        }}},
    }  # fmt: skip
    path = tmp_path / "stack.template.json"
    path.write_text(json.dumps({"Resources": resources}))
    return StackTemplate.load(path, "stack")


def read(tmp_path: Path, config: Any) -> Any:
    loaded = template(tmp_path, config)
    (found,) = read_lambda_deployments(loaded, Resolver(loaded, LocalValues(region="us-east-1", emulator_url="x")))
    return found


@pytest.mark.parametrize(
    ("config", "steps", "interval_sec"),
    [
        ({"Ref": "Config"}, (30, 60, 90, 100), 120.0),
        ("CodeDeployDefault.LambdaCanary10Percent5Minutes", (10, 100), 300.0),
        ("CodeDeployDefault.LambdaLinear10PercentEvery1Minute", tuple(range(10, 101, 10)), 60.0),
        ("CodeDeployDefault.LambdaAllAtOnce", (100,), 0.0),
    ],
)
def test_the_release_steps_are_the_deployment_configurations(
    tmp_path: Path, config: Any, steps: tuple[int, ...], interval_sec: float
) -> None:
    found = read(tmp_path, config)
    assert found.steps == steps
    assert found.interval_sec == interval_sec


def test_the_group_names_its_alias_hook_role_and_alarms(tmp_path: Path) -> None:
    found = read(tmp_path, {"Ref": "Config"})
    assert (found.function, found.alias, found.version) == ("api", "live", "1")
    assert found.alarms == ("errors",)
    assert (
        found.group_arn
        == f"arn:aws:codedeploy:us-east-1:123456789012:deploymentgroup:{found.application}/{found.group}"
    )
    assert found.hook is not None
    assert found.hook.code.startswith("def handler")
    assert found.hook.environment["TARGET_FUNCTION"] == "arn:aws:lambda:us-east-1:123456789012:function:api:1"
    assert found.hook.timeout_sec == 120


FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:api"
ALIAS_CALLS = ["lambda:GetAlias", "lambda:GetProvisionedConcurrencyConfig", "lambda:UpdateAlias"]


def released(tmp_path: Path, actions: list[str]) -> Release:
    """A release of the template's alias (no hook, no alarms: the alias calls alone) by a service role whose one
    statement allows `actions` on the function and its qualifiers, as servestack/cdk/serverless.py grants them."""
    found = dataclasses.replace(read(tmp_path, "CodeDeployDefault.LambdaAllAtOnce"), hook=None, alarms=())
    access = LocalAccess(log=lambda _: None)
    statement = {"Effect": "Allow", "Action": actions, "Resource": [FUNCTION, f"{FUNCTION}:*"]}
    keys = access.credentials_for(found.service_role_arn, ({"Version": "2012-10-17", "Statement": [statement]},))
    codedeploy = LocalCodeDeploy([found], access, emulator_url="x", front_url="y", region="us-east-1",
                                 env_base={}, run_dir=tmp_path, identities={})  # fmt: skip
    assert codedeploy.credentials[found.service_role_arn].access_key_id == keys.access_key_id  # the same keys
    release = Release("d-TEST", found, "me", 0.0)
    codedeploy._run(release)
    return release


def test_a_release_reads_and_moves_the_alias_under_the_service_roles_statements(tmp_path: Path) -> None:
    # GIVEN a service role allowed the alias calls WHEN a release runs THEN it shifts the alias
    release = released(tmp_path, ALIAS_CALLS)
    assert release.status == "Succeeded", release.messages
    assert any("traffic shifted: 100%" in m for m in release.messages)


@pytest.mark.parametrize(
    ("missing", "resource"),
    [
        ("lambda:GetAlias", FUNCTION),
        ("lambda:GetProvisionedConcurrencyConfig", f"{FUNCTION}:live"),
        ("lambda:UpdateAlias", FUNCTION),
    ],
)
def test_each_alias_call_is_authorized_as_the_service_role(tmp_path: Path, missing: str, resource: str) -> None:
    # GIVEN a service role without one of the alias calls (local mode holds no AWS managed policy to fall back on)
    release = released(tmp_path, [a for a in ALIAS_CALLS if a != missing])
    # THEN the release fails with the AccessDenied of that call, on its resource
    assert release.status == "Failed"
    assert release.error is not None
    assert release.error["code"] == "IAM_ROLE_PERMISSIONS"
    assert f"not authorized to perform: {missing} on resource: {resource} " in release.error["message"]
    assert not any("traffic shifted" in m for m in release.messages)


def test_get_schedule_is_authorized_on_the_schedule_in_its_group() -> None:
    request = sent("scheduler", "get_schedule", Name="nightly")
    grouped = sent("scheduler", "get_schedule", Name="nightly", GroupName="jobs")
    where = Where("us-east-1", "123456789012")
    assert describe(request, "scheduler", where).checks == (
        Check("scheduler:GetSchedule", "arn:aws:scheduler:us-east-1:123456789012:schedule/default/nightly"),
    )
    assert describe(grouped, "scheduler", where).checks == (
        Check("scheduler:GetSchedule", "arn:aws:scheduler:us-east-1:123456789012:schedule/jobs/nightly"),
    )
