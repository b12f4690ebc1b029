"""Serverless (Lambda) deployments: function, live alias, CodeDeploy, pre-traffic hook, HTTP API."""

from __future__ import annotations

import json

from aws_cdk.assertions import Capture, Match

from tests.infra.conftest import Synth


def test_function_is_python312_with_the_spec_memory_timeout_and_architecture(synth: Synth) -> None:
    synth.template("digits-api").has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "handlers.serverless.handler",
            "Runtime": "python3.12",
            "Architectures": ["x86_64"],
            "MemorySize": 2048,
            "Timeout": 10,
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "SERVESTACK_MODEL_DIR": "/var/task/models/artifacts",
                        "SERVESTACK_DEFAULT_MODEL": "digits",
                        "SERVESTACK_MAX_PAYLOAD_BYTES": "6291456",
                    }
                )
            },
        },
    )


def test_live_alias_has_provisioned_concurrency_autoscaled_on_utilisation(synth: Synth) -> None:
    t = synth.template("digits-api")

    t.has_resource_properties(
        "AWS::Lambda::Alias",
        {"Name": "live", "ProvisionedConcurrencyConfig": {"ProvisionedConcurrentExecutions": 1}},
    )
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {
            "ServiceNamespace": "lambda",
            "ScalableDimension": "lambda:function:ProvisionedConcurrency",
            "MinCapacity": 1,
            "MaxCapacity": 4,
        },
    )
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "TargetTrackingScalingPolicyConfiguration": Match.object_like(
                {
                    "PredefinedMetricSpecification": {
                        "PredefinedMetricType": "LambdaProvisionedConcurrencyUtilization"
                    },
                    "TargetValue": 0.7,
                }
            )
        },
    )


def test_codedeploy_shifts_traffic_linearly_as_the_spec_says(synth: Synth) -> None:
    synth.template("digits-api").has_resource_properties(
        "AWS::CodeDeploy::DeploymentConfig",
        {
            "ComputePlatform": "Lambda",
            "TrafficRoutingConfig": {
                "Type": "TimeBasedLinear",
                "TimeBasedLinear": {"LinearInterval": 2, "LinearPercentage": 25},
            },
        },
    )


def test_deployment_group_rolls_back_on_error_rate_p99_and_throttle_alarms(synth: Synth) -> None:
    t = synth.template("digits-api")
    alarms = Capture()

    t.has_resource_properties(
        "AWS::CodeDeploy::DeploymentGroup",
        {
            "AlarmConfiguration": {"Alarms": alarms, "Enabled": True},
            "AutoRollbackConfiguration": {
                "Enabled": True,
                "Events": Match.array_with(["DEPLOYMENT_FAILURE", "DEPLOYMENT_STOP_ON_ALARM"]),
            },
            "DeploymentStyle": {"DeploymentOption": "WITH_TRAFFIC_CONTROL", "DeploymentType": "BLUE_GREEN"},
        },
    )
    defined = synth.resources("digits-api", "AWS::CloudWatch::Alarm")
    names = {defined[a["Name"]["Ref"]]["Properties"]["AlarmName"] for a in alarms.as_array()}
    assert names == {
        "servestack-digits-api-error-rate",
        "servestack-digits-api-p99-duration",
        "servestack-digits-api-throttles",
    }
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-digits-api-p99-duration",
            "MetricName": "Duration",
            "ExtendedStatistic": "p99",
            "Threshold": 300,
            "Dimensions": Match.array_with([{"Name": "Resource", "Value": Match.any_value()}]),
        },
    )


def test_pre_traffic_hook_checks_the_new_version_with_the_sample_request(synth: Synth) -> None:
    t = synth.template("digits-api")
    hook = Capture()
    env = Capture()

    t.has_resource(
        "AWS::Lambda::Alias",
        {"UpdatePolicy": {"CodeDeployLambdaAliasUpdate": Match.object_like({"BeforeAllowTrafficHook": {"Ref": hook}})}},
    )
    t.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "index.handler",
            "Environment": {"Variables": env},
            "Code": {"ZipFile": Match.string_like_regexp("put_lifecycle_event_hook_execution_status")},
        },
    )
    variables = env.as_object()
    # the sample is the version's own (it answers {"servestack": "sample"}): none travels in the environment
    assert set(variables) == {"TARGET_FUNCTION", "REL_TOL"}
    versions = synth.resources("digits-api", "AWS::Lambda::Version")
    assert variables["TARGET_FUNCTION"]["Ref"] in versions  # the version CodeDeploy is about to shift to
    functions = synth.resources("digits-api", "AWS::Lambda::Function")
    assert "put_lifecycle" in functions[hook.as_string()]["Properties"]["Code"]["ZipFile"]


def test_http_api_requires_iam_auth_and_is_throttled(synth: Synth) -> None:
    t = synth.template("digits-api")

    t.has_resource_properties("AWS::ApiGatewayV2::Route", {"RouteKey": "$default", "AuthorizationType": "AWS_IAM"})
    t.resource_properties_count_is("AWS::ApiGatewayV2::Route", {"AuthorizationType": "NONE"}, 0)
    t.has_resource_properties(
        "AWS::ApiGatewayV2::Stage",
        {
            "StageName": "$default",
            "DefaultRouteSettings": {"ThrottlingRateLimit": 100, "ThrottlingBurstLimit": 200},
            "AccessLogSettings": Match.object_like({"DestinationArn": Match.any_value()}),
        },
    )
    t.has_resource_properties(
        "AWS::ApiGatewayV2::Integration", {"PayloadFormatVersion": "2.0", "TimeoutInMillis": 10_000}
    )


def test_function_role_can_only_write_its_own_logs(synth: Synth) -> None:
    roles = synth.resources("digits-api", "AWS::IAM::Role")
    for role in roles.values():  # no AWS managed policy on any role, the CodeDeploy service role's included
        assert "ManagedPolicyArns" not in role["Properties"]
    functions = synth.resources("digits-api", "AWS::Lambda::Function")
    main_role = next(
        f["Properties"]["Role"]["Fn::GetAtt"][0]
        for f in functions.values()
        if f["Properties"]["Handler"] == "handlers.serverless.handler"
    )
    policies = [
        p
        for p in synth.resources("digits-api", "AWS::IAM::Policy").values()
        if {"Ref": main_role} in p["Properties"]["Roles"]
    ]
    (policy,) = policies
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert set(statement["Action"]) == {"logs:CreateLogStream", "logs:PutLogEvents"}
    assert statement["Resource"]["Fn::GetAtt"][1] == "Arn"  # its own log group, by reference


def test_codedeploy_service_role_holds_only_what_a_lambda_release_calls(synth: Synth) -> None:
    # GIVEN the deployment group's service role, without the AWS managed policy CDK attaches
    (group,) = synth.resources("digits-api", "AWS::CodeDeploy::DeploymentGroup").values()
    role_id = group["Properties"]["ServiceRoleArn"]["Fn::GetAtt"][0]
    role = synth.resources("digits-api", "AWS::IAM::Role")[role_id]
    assert "ManagedPolicyArns" not in role["Properties"]
    # WHEN its statements are read
    statements = [
        s
        for p in synth.resources("digits-api", "AWS::IAM::Policy").values()
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    by_actions = {tuple(sorted(_as_list(s["Action"]))): _as_list(s["Resource"]) for s in statements}
    functions = synth.resources("digits-api", "AWS::Lambda::Function")
    (main,) = [k for k, f in functions.items() if f["Properties"]["Handler"] == "handlers.serverless.handler"]
    (hook,) = [k for k, f in functions.items() if f["Properties"]["Handler"] == "index.handler"]
    alarms = synth.resources("digits-api", "AWS::CloudWatch::Alarm")
    # THEN the alias calls on this function and its qualifiers, the group's own alarms, the hook: nothing else
    assert set(by_actions) == {
        ("lambda:GetAlias", "lambda:GetProvisionedConcurrencyConfig", "lambda:UpdateAlias"),
        ("cloudwatch:DescribeAlarms",),
        ("lambda:InvokeFunction",),
    }
    alias_calls = by_actions[("lambda:GetAlias", "lambda:GetProvisionedConcurrencyConfig", "lambda:UpdateAlias")]
    assert alias_calls[0] == {"Fn::GetAtt": [main, "Arn"]}
    assert alias_calls[1]["Fn::Join"][1] == [{"Fn::GetAtt": [main, "Arn"]}, ":*"]
    group_alarms = {a["Name"]["Ref"] for a in group["Properties"]["AlarmConfiguration"]["Alarms"]}
    described = {r["Fn::GetAtt"][0] for r in by_actions[("cloudwatch:DescribeAlarms",)]}
    assert described == group_alarms
    assert described <= set(alarms)
    assert {json.dumps(r) for r in by_actions[("lambda:InvokeFunction",)]} == {
        json.dumps({"Fn::GetAtt": [hook, "Arn"]}),
        json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [hook, "Arn"]}, ":*"]]}),
    }


def _as_list(value: object) -> list[object]:
    return value if isinstance(value, list) else [value]
