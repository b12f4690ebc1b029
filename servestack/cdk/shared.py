"""Pieces every deployment stack shares: the artifact bucket, log groups with retention, an IAM-authenticated
HTTP API front door, and small validation helpers for construct props."""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import Acknowledgment, ArnFormat, CfnElement, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_apigatewayv2 as apigw
from aws_cdk import aws_apigatewayv2_authorizers as apigw_auth
from aws_cdk import aws_apigatewayv2_integrations as apigw_int
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct, IConstruct

from servestack.aws_rules import HTTP_API_TIMEOUT_SEC

# CloudWatch Logs retention periods, by days.
_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}


def check_range(construct: str, prop: str, value: float, lo: float, hi: float) -> None:
    """Raise ValueError naming the prop, the bad value and the allowed range."""
    if not lo <= value <= hi:
        raise ValueError(f"{construct}: {prop}={value!r} is not in {lo:g}..{hi:g}")


def check_choice(construct: str, prop: str, value: object, allowed: Iterable[object]) -> None:
    """Raise ValueError naming the prop, the bad value and the allowed values."""
    options = list(allowed)
    if value not in options:
        raise ValueError(f"{construct}: {prop}={value!r} is not one of {', '.join(repr(o) for o in options)}")


def retention(days: int) -> logs.RetentionDays:
    check_choice("retention", "log_retention_days", days, _RETENTION)
    return _RETENTION[days]


def logical_id(construct: IConstruct) -> str:
    """The logical id cdk-nag prints for a construct's CloudFormation resource (`<id>.Arn`)."""
    resource = construct if isinstance(construct, CfnElement) else construct.node.default_child
    return str(Stack.of(construct).get_logical_id(resource))  # type: ignore[arg-type]


def acknowledge(construct: IConstruct, findings: dict[str, str]) -> None:
    """cdk-nag acknowledgements, each with its reason, keyed by rule id (`AwsSolutions-S1`) or exact finding
    id (`AwsSolutions-IAM5[Resource::*]`). They apply to `construct` and everything under it."""
    Validations.of(construct).acknowledge(*(Acknowledgment(id=k, reason=v) for k, v in findings.items()))


class ArtifactBucket(Construct):
    """The deployment's data bucket: SSE-S3, TLS-only, versioned, public access blocked, access-logged.

    Holds async payloads and results, batch inputs and outputs, SageMaker async outputs.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        noncurrent_version_expiry_days: int = 30,
        access_log_expiry_days: int = 90,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        check_range("ArtifactBucket", "noncurrent_version_expiry_days", noncurrent_version_expiry_days, 1, 3650)
        check_range("ArtifactBucket", "access_log_expiry_days", access_log_expiry_days, 1, 3650)
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(access_log_expiry_days))],
            removal_policy=removal_policy,
        )
        acknowledge(
            self.access_logs,
            {"AwsSolutions-S1": "This bucket is the server access log target; logging it into itself loops."},
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(noncurrent_version_expiry_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
            removal_policy=removal_policy,
        )
        self._deliver_access_logs(prefix="artifacts/")

    def _deliver_access_logs(self, *, prefix: str) -> None:
        """Server access logs of the bucket into the log bucket, delivered by S3's logging service under a bucket
        policy (the only way into a bucket whose ACLs are disabled), set here rather than left to the app's
        `@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy` feature flag: without that flag CDK would grant the
        log delivery group an ACL, which BUCKET_OWNER_ENFORCED refuses, so the construct works in any app."""
        cfn = self.bucket.node.default_child
        assert isinstance(cfn, s3.CfnBucket)
        cfn.logging_configuration = s3.CfnBucket.LoggingConfigurationProperty(
            destination_bucket_name=self.access_logs.bucket_name, log_file_prefix=prefix
        )
        self.access_logs.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("logging.s3.amazonaws.com")],
                actions=["s3:PutObject"],
                resources=[self.access_logs.arn_for_objects(f"{prefix}*")],
                conditions={
                    "ArnLike": {"aws:SourceArn": self.bucket.bucket_arn},
                    "StringEquals": {"aws:SourceAccount": Stack.of(self).account},
                },
            )
        )


def log_group(scope: Construct, id: str, *, retention_days: int) -> logs.LogGroup:
    """A log group with the deployment's retention (kept on stack deletion: logs are evidence)."""
    return logs.LogGroup(scope, id, retention=retention(retention_days), removal_policy=RemovalPolicy.RETAIN)


def endpoint_log_group(scope: Construct, id: str, *, endpoint_name: str, retention_days: int) -> logs.LogGroup:
    """The log group SageMaker writes an endpoint's containers to (`/aws/sagemaker/Endpoints/<name>`), created
    ahead of SageMaker so that it has the deployment's retention."""
    return logs.LogGroup(
        scope,
        id,
        log_group_name=f"/aws/sagemaker/Endpoints/{endpoint_name}",
        retention=retention(retention_days),
        removal_policy=RemovalPolicy.RETAIN,
    )


def grant_sagemaker_logging(role: iam.IRole, log_group: logs.ILogGroup) -> None:
    """A SageMaker execution role's CloudWatch Logs access, to the one log group SageMaker writes its containers
    to (an endpoint's, or an inference component's): the four actions AWS's execution-role page lists for
    CreateModel (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html), logs:CreateLogStream,
    logs:PutLogEvents, logs:CreateLogGroup and logs:DescribeLogStreams.

    The stack creates the group before the endpoint (the role's policy names it; the endpoint configuration
    depends on the role), so SageMaker never needs to create it, and its log agent is AWS's and not observable:
    whether it calls CreateLogGroup or DescribeLogStreams before writing, and whether an AccessDenied there loses
    the endpoint's logs, is not documented. Scoped to this group, the two cost next to nothing: CreateLogGroup
    can only fail with ResourceAlreadyExists (or put this very group back, should someone delete it), and
    DescribeLogStreams lists this group's stream names, no log data. So the role gets them rather than risk an
    endpoint whose logs are lost without a trace. Local mode's shipper signs CreateLogStream and PutLogEvents
    only (servestack/local/logs/shipping.py), so a local run neither needs nor exercises the other two;
    tests/infra/test_realtime.py pins the grant."""
    log_group.grant_write(role)
    # Both forms of the group's ARN: CloudWatch Logs matches some actions against `log-group:<name>` and others
    # against `log-group:<name>:*` (log_group_arn), and neither ends in a wildcard that reaches another group.
    bare_arn = Stack.of(log_group).format_arn(
        service="logs",
        resource="log-group",
        resource_name=log_group.log_group_name,
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"], resources=[bare_arn, log_group.log_group_arn]
        )
    )


def lambda_role(scope: Construct, id: str, logs_to: logs.ILogGroup) -> iam.Role:
    """A function role that can write only to its own log group (no AWS managed policy)."""
    role = iam.Role(scope, id, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    logs_to.grant_write(role)
    return role


class IamHttpApi(Construct):
    """An HTTP API whose every route needs SigV4 (IAM auth), throttled, access-logged, sending all paths to
    `handler` (payload format 2.0). Callers need `execute-api:Invoke` on `api_arn`."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        handler: lambda_.IFunction,
        throttle_rate_per_sec: int = 100,
        throttle_burst: int = 200,
        log_retention_days: int = 30,
        integration_timeout_sec: int = HTTP_API_TIMEOUT_SEC,
    ) -> None:
        super().__init__(scope, id)
        check_range("IamHttpApi", "throttle_rate_per_sec", throttle_rate_per_sec, 1, 10_000)
        check_range("IamHttpApi", "throttle_burst", throttle_burst, 1, 5_000)
        check_range("IamHttpApi", "integration_timeout_sec", integration_timeout_sec, 1, HTTP_API_TIMEOUT_SEC)
        self.api = apigw.HttpApi(
            self,
            "Api",
            create_default_stage=False,
            default_authorizer=apigw_auth.HttpIamAuthorizer(),
            default_integration=apigw_int.HttpLambdaIntegration(
                "Handler",
                handler,
                payload_format_version=apigw.PayloadFormatVersion.VERSION_2_0,
                timeout=Duration.seconds(integration_timeout_sec),
            ),
        )
        self.access_logs = log_group(self, "AccessLogs", retention_days=log_retention_days)
        self.stage = apigw.HttpStage(
            self,
            "Stage",
            http_api=self.api,
            stage_name="$default",
            auto_deploy=True,
            throttle=apigw.ThrottleSettings(rate_limit=throttle_rate_per_sec, burst_limit=throttle_burst),
        )
        cfn_stage = self.stage.node.default_child
        assert isinstance(cfn_stage, apigw.CfnStage)
        cfn_stage.access_log_settings = apigw.CfnStage.AccessLogSettingsProperty(
            destination_arn=self.access_logs.log_group_arn,
            format=(
                '{"requestId":"$context.requestId","ip":"$context.identity.sourceIp",'
                '"caller":"$context.identity.caller","user":"$context.identity.user",'
                '"requestTime":"$context.requestTime","httpMethod":"$context.httpMethod",'
                '"routeKey":"$context.routeKey","status":"$context.status","protocol":"$context.protocol",'
                '"responseLength":"$context.responseLength","latency":"$context.responseLatency",'
                '"integrationLatency":"$context.integrationLatency","error":"$context.error.message"}'
            ),
        )
        self.url = self.api.api_endpoint
        self.api_arn = self.api.arn_for_execute_api()

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let `grantee` call every route (SigV4-signed requests)."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["execute-api:Invoke"], resource_arns=[self.api.arn_for_execute_api()]
        )
