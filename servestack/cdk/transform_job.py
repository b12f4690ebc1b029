"""The Batch Transform runner's parts in AWS (servestack/cdk/batch.py, `runner: transform`): the job's
execution role and the schedule's target, SageMaker's CreateTransformJob request through EventBridge Scheduler's
universal target (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html)."""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, Duration
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from servestack.cdk.shared import acknowledge
from servestack.gpu_families import transform_ami
from servestack.spec import uses_gpu


def transform_role(
    scope: Construct,
    *,
    bucket: s3.IBucket,
    image: ecr_assets.DockerImageAsset,
    model_data: s3_assets.Asset,
    output_prefix: str,
    statements: tuple[iam.PolicyStatement, ...],
    prefix_findings: dict[str, str],
) -> iam.Role:
    """The job's execution role (`TransformRole` in `scope`): `statements` read the input."""
    # The job's execution role: pull the image, read the model and the input, write answers (.out) under
    # the output prefix, and its own logs and metrics.
    role = iam.Role(scope, "TransformRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    image.repository.grant_pull(role)
    role.add_to_policy(
        iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[model_data.bucket.arn_for_objects(model_data.s3_object_key)]
        )
    )
    for statement in statements:
        role.add_to_policy(statement)
    role.add_to_policy(
        iam.PolicyStatement(actions=["s3:PutObject"], resources=[bucket.arn_for_objects(f"{output_prefix}*")])
    )
    role.add_to_policy(
        iam.PolicyStatement(
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
            resources=[
                f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:/aws/sagemaker/TransformJobs*"
            ],
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/TransformJobs*"}},
        )
    )
    acknowledge(
        role,
        prefix_findings
        | {
            "AwsSolutions-IAM5[Resource::*]": (
                "ecr:GetAuthorizationToken and cloudwatch:PutMetricData have no resource-level permissions "
                "(the latter is limited to SageMaker's TransformJobs namespace by a condition)."
            ),
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
            "/aws/sagemaker/TransformJobs*]": (
                "SageMaker names each transform job's log streams at run time under its TransformJobs log group."
            ),
        },
    )
    return role


def transform_target(
    scope: Construct,
    *,
    name: str,
    bucket: s3.IBucket,
    model: sagemaker.CfnModel,
    role: iam.Role,
    input_prefix: str,
    output_prefix: str,
    content_type: str,
    instance_type: str,
    instance_count: int,
    max_payload_mb: int,
    max_concurrent_transforms: int,
    timeout_sec: int,
    dead_letters: sqs.IQueue,
    retry_attempts: int,
    max_event_age_sec: int,
) -> scheduler.IScheduleTarget:
    """The schedule's target (its role `SchedulerRole` in `scope`): a transform job named
    `<name>-<execution id>` over the input prefix, answers under the output prefix."""
    job: dict[str, Any] = {
        "TransformJobName": f"{name}-{scheduler.ContextAttribute.execution_id}",
        "ModelName": model.attr_model_name,
        "MaxConcurrentTransforms": max_concurrent_transforms,
        "MaxPayloadInMB": max_payload_mb,
        "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {"InvocationsTimeoutInSeconds": timeout_sec, "InvocationsMaxRetries": 1},
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": bucket.s3_url_for_object(input_prefix)}},
            "ContentType": content_type,
            "CompressionType": "None",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": bucket.s3_url_for_object(output_prefix.rstrip("/")),
            "Accept": "application/jsonlines",
            "AssembleWith": "Line",
        },
        "TransformResources": {
            "InstanceType": instance_type,
            "InstanceCount": instance_count,
            # The CUDA 13 GPU image needs a driver >= 580, which no TransformAmiVersion carries yet: `transform_ami`
            # refuses GPU types (as the spec does), rather than a job whose CUDA provider cannot load.
            **({"TransformAmiVersion": transform_ami(instance_type)} if uses_gpu(instance_type) else {}),
        },
    }
    scheduler_role = iam.Role(scope, "SchedulerRole", assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"))
    target = targets.Universal(
        service="sagemaker",
        action="createTransformJob",
        input=scheduler.ScheduleTargetInput.from_object(job),
        role=scheduler_role,
        policy_statements=[
            iam.PolicyStatement(
                actions=["sagemaker:CreateTransformJob"],
                resources=[
                    f"arn:{Aws.PARTITION}:sagemaker:{Aws.REGION}:{Aws.ACCOUNT_ID}:transform-job/{name.lower()}-*"
                ],
            ),
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            ),
        ],
        dead_letter_queue=dead_letters,
        retry_attempts=retry_attempts,
        max_event_age=Duration.seconds(max_event_age_sec),
    )
    acknowledge(
        scheduler_role,
        {
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:"
            f"transform-job/{name.lower()}-*]": (
                "Each run creates a job named <deployment>-<execution id>, only known at run time; the role "
                "can create jobs of this deployment's name only."
            )
        },
    )
    return target
