"""Serverless mode: a Lambda function (servestack/adapters/serverless.py) behind an IAM-authenticated HTTP API.

Releases go through a `live` alias shifted by CodeDeploy (canary / linear / all at once, from the spec) with
a pre-traffic hook that sends the model's sample request to the new version and fails the release on a
wrong answer, and auto-rollback on the alias's error-rate, p99-duration and throttle alarms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_codedeploy as codedeploy
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

import servestack.cdk.guardrails as guardrails
from servestack.aws_rules import HTTP_API_TIMEOUT_SEC
from servestack.cdk.bundling import LAMBDA_DOCKERFILE, FunctionCode
from servestack.cdk.shared import (
    IamHttpApi,
    acknowledge,
    check_choice,
    check_range,
    lambda_role,
    log_group,
    logical_id,
)
from servestack.spec import AlarmSettings, Strategy

HANDLER = "handlers.serverless.handler"
LAMBDA_MODEL_DIR = "/var/task/models/artifacts"
_HOOK_SOURCE = Path(__file__).parent / "hooks" / "pre_traffic.py"
_ARCH = {"x86_64": lambda_.Architecture.X86_64, "arm64": lambda_.Architecture.ARM_64}
RUNTIME = lambda_.Runtime.PYTHON_3_12
RUNTIME_REASON = (
    "Python 3.12 is pinned on purpose: the bundle's wheels (onnxruntime, numpy, pydantic-core, orjson) are "
    "built for cp312 and a runtime change is a tested, deliberate upgrade, not an automatic one."
)


def runtime_environment(*, model_name: str, max_payload_bytes: int, **extra: str) -> dict[str, str]:
    """The `SERVESTACK_*` settings every servestack Lambda reads (see servestack/inference/settings.py)."""
    return {
        "SERVESTACK_MODEL_DIR": LAMBDA_MODEL_DIR,
        "SERVESTACK_DEFAULT_MODEL": model_name,
        "SERVESTACK_PROVIDERS": "auto",
        "SERVESTACK_MAX_PAYLOAD_BYTES": str(max_payload_bytes),
        "POWERTOOLS_SERVICE_NAME": "servestack",
        **extra,
    }


def servestack_function(
    scope: Construct,
    id: str,
    *,
    code: lambda_.Code | FunctionCode,
    handler: str,
    environment: dict[str, str],
    memory_mib: int,
    timeout_sec: int,
    architecture: str,
    log_retention_days: int,
    reserved_concurrency: int | None = None,
    description: str = "",
    function_name: str | None = None,
) -> lambda_.Function:
    """A Python 3.12 function with its own log group and a role that can only write there: a zip bundle, or a
    container image (`FunctionCode.image_context`, past Lambda's zip limit) whose command is `handler`.
    `function_name` fixes the name of a function something outside its stack calls (the pipeline's smoke test,
    granted by name)."""
    check_range(id, "memory_mib", memory_mib, 128, 10240)
    check_range(id, "timeout_sec", timeout_sec, 1, 900)
    check_choice(id, "architecture", architecture, _ARCH)
    logs = log_group(scope, f"{id}Logs", retention_days=log_retention_days)
    common: dict[str, Any] = {
        "architecture": _ARCH[architecture],
        "memory_size": memory_mib,
        "timeout": Duration.seconds(timeout_sec),
        "environment": environment,
        "reserved_concurrent_executions": reserved_concurrency,
        "role": lambda_role(scope, f"{id}Role", logs),
        "log_group": logs,
        "logging_format": lambda_.LoggingFormat.JSON,
        "description": description,
        "function_name": function_name,
    }
    if isinstance(code, FunctionCode) and code.image_context is not None:
        image = lambda_.DockerImageCode.from_image_asset(
            str(code.image_context),
            file=LAMBDA_DOCKERFILE,
            cmd=[handler],
            platform=ecr_assets.Platform.LINUX_ARM64 if architecture == "arm64" else ecr_assets.Platform.LINUX_AMD64,
        )
        return lambda_.DockerImageFunction(scope, id, code=image, **common)
    zipped = code.zip if isinstance(code, FunctionCode) else code
    assert zipped is not None
    fn = lambda_.Function(scope, id, runtime=RUNTIME, handler=handler, code=zipped, **common)
    acknowledge(fn, {"AwsSolutions-L1": RUNTIME_REASON})
    return fn


class ServerlessEndpoint(Construct):
    """Lambda + `live` alias (+ provisioned concurrency) + CodeDeploy + HTTP API (IAM auth), with alarms.

    The pre-traffic hook checks each new version before it takes traffic with the sample its code carries (the
    model package's `sample-request.json` and `sample-response.json`), which it asks the version for.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        name: str,
        code: lambda_.Code | FunctionCode,
        model_name: str,
        handler: str = HANDLER,
        memory_mib: int = 2048,
        timeout_sec: int = 15,
        architecture: str = "x86_64",
        reserved_concurrency: int | None = None,
        provisioned_concurrency_min: int = 0,
        provisioned_concurrency_max: int = 0,
        provisioned_utilization_percent: int = 70,
        throttle_rate_per_sec: int = 100,
        throttle_burst: int = 200,
        max_payload_bytes: int = 6_291_456,
        log_retention_days: int = 30,
        strategy: Strategy | None = None,
        alarms: AlarmSettings | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_range("ServerlessEndpoint", "timeout_sec", timeout_sec, 1, HTTP_API_TIMEOUT_SEC)
        check_range("ServerlessEndpoint", "provisioned_concurrency_min", provisioned_concurrency_min, 0, 10_000)
        check_range(
            "ServerlessEndpoint",
            "provisioned_concurrency_max",
            provisioned_concurrency_max,
            provisioned_concurrency_min,
            10_000,
        )
        check_range("ServerlessEndpoint", "max_payload_bytes", max_payload_bytes, 1, 6_291_456)
        strategy = strategy or Strategy()
        alarms = alarms or AlarmSettings()

        self.function = servestack_function(
            self,
            "Function",
            code=code,
            handler=handler,
            environment=runtime_environment(model_name=model_name, max_payload_bytes=max_payload_bytes),
            memory_mib=memory_mib,
            timeout_sec=timeout_sec,
            architecture=architecture,
            log_retention_days=log_retention_days,
            reserved_concurrency=reserved_concurrency,
            description=f"servestack {name}: {model_name} over HTTP (servestack.adapters.serverless)",
            function_name=name,
        )
        version = self.function.current_version
        self.alias = lambda_.Alias(
            self,
            "Live",
            alias_name="live",
            version=version,
            provisioned_concurrent_executions=provisioned_concurrency_min or None,
        )
        if provisioned_concurrency_max > provisioned_concurrency_min:
            scaling = self.alias.add_auto_scaling(
                min_capacity=provisioned_concurrency_min, max_capacity=provisioned_concurrency_max
            )
            scaling.scale_on_utilization(utilization_target=provisioned_utilization_percent / 100)

        self.alarms = guardrails.lambda_alarms(self, name=name, alias=self.alias, settings=alarms)
        self.pre_traffic_hook = self._pre_traffic_hook(name, version, log_retention_days)
        self.deployment_group = codedeploy.LambdaDeploymentGroup(
            self,
            "Deployment",
            alias=self.alias,
            deployment_config=guardrails.lambda_deployment_config(self, "DeploymentConfig", strategy),
            alarms=self.alarms,
            pre_hook=self.pre_traffic_hook,
            auto_rollback=codedeploy.AutoRollbackConfig(
                failed_deployment=True, stopped_deployment=True, deployment_in_alarm=True
            ),
        )
        self._least_privilege_service_role()
        hook_id = logical_id(self.pre_traffic_hook)
        function_id = logical_id(self.function)
        acknowledge(
            self.deployment_group,
            {
                f"AwsSolutions-IAM5[Resource::<{hook_id}.Arn>:*]": (
                    "CDK's invoke grant lets CodeDeploy call this deployment's own pre-traffic hook, "
                    "including its versions (`<arn>:*`); no other function."
                ),
                f"AwsSolutions-IAM5[Resource::<{function_id}.Arn>:*]": (
                    "CodeDeploy reads and moves this function's `live` alias and reads its provisioned "
                    "concurrency (`<arn>:<alias>`); no other function."
                ),
            },
        )

        self.http = IamHttpApi(
            self,
            "Http",
            handler=self.alias,
            integration_timeout_sec=timeout_sec,
            throttle_rate_per_sec=throttle_rate_per_sec,
            throttle_burst=throttle_burst,
            log_retention_days=log_retention_days,
        )
        self.api_5xx_alarm = cw.Alarm(
            self,
            "Api5xx",
            alarm_name=f"{name}-api-5xx",
            alarm_description=f"{name}: HTTP API answered 5xx",
            metric=self.http.api.metric_server_error(period=Duration.seconds(alarms.period_sec), statistic="Sum"),
            threshold=0,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=alarms.evaluation_periods,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )

    def _least_privilege_service_role(self) -> None:
        """The CodeDeploy service role with the statements a Lambda release uses, instead of the AWS managed
        policy `AWSCodeDeployRoleForLambdaLimited` that LambdaDeploymentGroup attaches to any role, its own
        or one passed in (its constructor calls `role.addManagedPolicy` unconditionally). That policy grants
        `cloudwatch:DescribeAlarms`, `lambda:UpdateAlias`, `lambda:GetAlias` and
        `lambda:GetProvisionedConcurrencyConfig` on `*`, S3 reads of revisions (a Lambda release carries its
        AppSpec in CreateDeployment and reads no S3 object) and `lambda:InvokeFunction` on `CodeDeployHook_*`
        functions (our hook has another name; CDK grants its invoke below). SNS publishing, in the
        non-limited policy, serves triggers, which this group has none of.

        The managed policy is taken off the L1 role (the escape hatch): the L2 keeps no API to remove one, and
        clearing `ManagedPolicyArns` on the CfnRole removes it from the template and from what cdk-nag sees."""
        role = self.deployment_group.role
        cfn_role = role.node.default_child
        assert isinstance(cfn_role, iam.CfnRole)
        cfn_role.managed_policy_arns = None
        # Each release reads the alias, its provisioned concurrency, then moves it: one statement, exercised
        # by every release (servestack/local/codedeploy.py authorizes the three calls against it).
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["lambda:GetAlias", "lambda:GetProvisionedConcurrencyConfig", "lambda:UpdateAlias"],
                resources=[self.function.function_arn, f"{self.function.function_arn}:*"],
            )
        )
        if self.alarms:  # before each shift; DescribeAlarms takes alarm ARNs (only composite alarms need `*`)
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["cloudwatch:DescribeAlarms"], resources=[alarm.alarm_arn for alarm in self.alarms]
                )
            )

    def _pre_traffic_hook(
        self,
        name: str,
        version: lambda_.IVersion,
        log_retention_days: int,
    ) -> lambda_.Function:
        logs = log_group(self, "PreTrafficHookLogs", retention_days=log_retention_days)
        hook = lambda_.Function(
            self,
            "PreTrafficHook",
            runtime=RUNTIME,
            handler="index.handler",
            code=lambda_.Code.from_inline(_HOOK_SOURCE.read_text(encoding="utf-8")),
            timeout=Duration.minutes(2),
            memory_size=256,
            role=lambda_role(self, "PreTrafficHookRole", logs),
            log_group=logs,
            environment={
                "TARGET_FUNCTION": version.function_arn,
                "REL_TOL": "1e-4",
            },
            description=f"servestack {name}: CodeDeploy BeforeAllowTraffic check with the sample request",
        )
        version.grant_invoke(hook)
        acknowledge(hook, {"AwsSolutions-L1": RUNTIME_REASON})
        return hook
