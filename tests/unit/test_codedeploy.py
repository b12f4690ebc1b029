"""Local CodeDeploy's reading of the templates (the group, the alias it releases, the hook, the steps of its
configuration) and its API's refusals; Scheduler's GetSchedule as the enforcer describes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servestack.local.cloudformation.templates import LocalValues, Resolver, StackTemplate
from servestack.local.codedeploy.definitions import read_lambda_deployments
from servestack.local.codedeploy.deployments import AWS_MANAGED, LocalCodeDeploy
from servestack.local.iam.access import LocalAccess
from servestack.local.iam.operations import Check, Where, describe
from tests.unit.test_iam_operations import sent

GROUP = {"Ref": "Group"}


def template(tmp_path: Path, config: Any) -> StackTemplate:
    resources: dict[str, Any] = {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {
            "AssumeRolePolicyDocument": {},
            "ManagedPolicyArns": [{"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"},
                                                     ":iam::aws:policy/service-role/AWSCodeDeployRoleForLambdaLimited"]]}],
        }},
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
    assert found.managed_policies == ("AWSCodeDeployRoleForLambdaLimited",)
    assert (
        found.group_arn
        == f"arn:aws:codedeploy:us-east-1:123456789012:deploymentgroup:{found.application}/{found.group}"
    )
    assert found.hook is not None
    assert found.hook.code.startswith("def handler")
    assert found.hook.environment["TARGET_FUNCTION"] == "arn:aws:lambda:us-east-1:123456789012:function:api:1"
    assert found.hook.timeout_sec == 120


def test_the_service_role_holds_its_managed_policy_under_its_own_keys(tmp_path: Path) -> None:
    # GIVEN the CodeDeploy role known to the store with its template statements only (as local up starts it)
    found = read(tmp_path, {"Ref": "Config"})
    access = LocalAccess(log=lambda _: None)
    before = access.credentials_for(found.service_role_arn, ())
    assert access.authorize(found.service_role_arn, "lambda:UpdateAlias", "arn:aws:lambda:us-east-1:1:function:api")
    # WHEN local CodeDeploy starts THEN the role has the managed policy's statements, under the same keys
    codedeploy = LocalCodeDeploy([found], access, emulator_url="x", front_url="y", region="us-east-1",
                                 env_base={}, run_dir=tmp_path, identities={})  # fmt: skip
    assert codedeploy.credentials[found.service_role_arn].access_key_id == before.access_key_id
    assert (
        access.authorize(found.service_role_arn, "lambda:UpdateAlias", "arn:aws:lambda:us-east-1:1:function:api")
        is None
    )
    assert access.authorize(found.service_role_arn, "sns:Publish", "*") is not None  # the Limited variant has none
    assert "AWSCodeDeployRoleForLambdaLimited" in AWS_MANAGED


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
