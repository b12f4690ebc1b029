"""The AWS rules `serving.yaml` must hold, each with the documentation page that states it: servestack/spec/
refuses a setting that breaks one and quotes the rule in its error, so the message says why, not only what.

This module must not import aws_cdk (the CLI imports the spec).
"""

from __future__ import annotations

from dataclasses import dataclass

# How long a serverless deployment's function and its HTTP API route may run: API Gateway's HTTP APIs end an
# integration after at most 30 s (`TimeoutInMillis` 50..30,000; the AWS::ApiGatewayV2::Integration reference),
# and aws-cdk-lib's integrations allow at most 29 s ("Integration timeout must be between 50 milliseconds and
# 29 seconds"). The spec and the constructs take this one number.
HTTP_API_TIMEOUT_SEC = 29


@dataclass(frozen=True)
class AwsRule:
    """A rule AWS enforces (or a behaviour it documents) that a setting would break, and the page stating it."""

    text: str
    url: str

    def __str__(self) -> str:
        return f"AWS: {self.text} ({self.url})"


@dataclass(frozen=True)
class EngineLimit:
    """What one AWS engine accepts of a single request: its body's size and how long the model may take, each with
    the page that states it. The spec refuses a `max_payload_bytes` past `max_payload_bytes`, the constructs give
    the container both numbers (its environment), and local mode enforces them."""

    engine: str
    max_payload_bytes: int
    timeout_sec: int
    payload_source: str
    timeout_source: str

    @property
    def rule(self) -> AwsRule:
        return AwsRule(
            f"{self.engine} accepts a request of at most {self.max_payload_bytes} bytes",
            self.payload_source,
        )


MIB = 1024 * 1024
# The limits per engine: AWS writes "MB" and "GB" for binary units (InvokeEndpoint's Body: "Maximum length of
# 6291456"), so 4 MB is read as 4 MiB and 1 GB as 1 GiB. docs/deploy.md's table is this one.
SAGEMAKER_REALTIME = EngineLimit(
    "SageMaker realtime (InvokeEndpoint)",
    6 * MIB,
    60,
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpoint.html",
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpoint.html",
)
SAGEMAKER_SERVERLESS = EngineLimit(
    "SageMaker Serverless Inference",
    4 * MIB,
    60,
    "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints-invoke.html",
    "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints-invoke.html",
)
SAGEMAKER_ASYNC = EngineLimit(
    "SageMaker asynchronous inference (InvokeEndpointAsync)",
    1024 * MIB,
    3600,
    "https://docs.aws.amazon.com/sagemaker/latest/dg/async-inference.html",
    "https://docs.aws.amazon.com/sagemaker/latest/dg/async-inference-invoke-endpoint.html",
)
LAMBDA_SYNC = EngineLimit(
    "Lambda, synchronous invocation (RequestResponse)",
    6 * MIB,
    900,
    "https://docs.aws.amazon.com/lambda/latest/dg/API_Invoke.html",
    "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html",
)
# Raised from 256 KB to 1 MB in 2025: the Invoke reference now reads "For asynchronous invocations, the maximum
# payload size is 1 MB" (the deprecated InvokeAsync keeps 256 KB).
LAMBDA_EVENT = EngineLimit(
    "Lambda, asynchronous invocation (Event)",
    1 * MIB,
    900,
    "https://docs.aws.amazon.com/lambda/latest/dg/API_Invoke.html",
    "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html",
)
# Per mini-batch: MaxPayloadInMB (<= 100), and MaxConcurrentTransforms x MaxPayloadInMB <= 100 MB per instance.
# The timeout is InvocationsTimeoutInSeconds' ceiling (ModelClientConfig, 1..3600, default 600).
BATCH_TRANSFORM = EngineLimit(
    "SageMaker Batch Transform (MaxPayloadInMB x MaxConcurrentTransforms)",
    100 * MIB,
    3600,
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html",
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ModelClientConfig.html",
)
ENGINE_LIMITS = (SAGEMAKER_REALTIME, SAGEMAKER_SERVERLESS, SAGEMAKER_ASYNC, LAMBDA_SYNC, LAMBDA_EVENT, BATCH_TRANSFORM)
LARGEST_PAYLOAD_BYTES = max(limit.max_payload_bytes for limit in ENGINE_LIMITS)


TRANSFORM_PAYLOAD_RULE = AwsRule(
    "CreateTransformJob refuses a MaxPayloadInMB greater than 100 MB, and (MaxConcurrentTransforms * MaxPayloadInMB) "
    "also cannot exceed 100 MB",
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html",
)
FARGATE_SIZE_RULE = AwsRule(
    "a Fargate task's memory must be one of the values its CPU allows (256: 512-2048 MiB; 512: 1-4 GiB; 1024: "
    "2-8 GiB; 2048: 4-16 GiB and 4096: 8-30 GiB in 1 GiB steps; 8192: 16-60 GiB in 4 GiB steps; 16384: 32-120 GiB "
    "in 8 GiB steps), or RegisterTaskDefinition fails with \"Invalid 'cpu' setting for task\"",
    "https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-cpu-memory-error.html",
)
SERVERLESS_EXCLUSIONS_RULE = AwsRule(
    "SageMaker Serverless Inference does not support GPUs, multi-model endpoints, VPC configuration, network "
    "isolation, data capture, multiple production variants, Model Monitor or inference pipelines",
    "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html",
)
ALARM_PERIOD_RULE = AwsRule(
    "specify a period of 10, 20 or 30 s only for metrics stored with a StorageResolution of 1; SageMaker, Lambda, "
    "API Gateway and SQS publish 1-minute metrics, so such an alarm lapses into INSUFFICIENT_DATA, and with missing "
    "data not breaching it never fires (no rollback would ever trigger)",
    "https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricAlarm.html",
)
# Fargate task sizes: CPU units -> (lowest MiB, highest MiB, step MiB).
FARGATE_MEMORY_MIB = {
    256: (512, 2048, 512),
    512: (1024, 4096, 1024),
    1024: (2048, 8192, 1024),
    2048: (4096, 16384, 1024),
    4096: (8192, 30720, 1024),
    8192: (16384, 61440, 4096),
    16384: (32768, 122880, 8192),
}


def fargate_memory_choices(cpu: int) -> list[int]:
    """The task memory values (MiB) Fargate accepts with `cpu` units (256 CPU: 512, 1024, 2048 MiB)."""
    lo, hi, step = FARGATE_MEMORY_MIB[cpu]
    return [512, 1024, 2048] if cpu == 256 else list(range(lo, hi + 1, step))


AUTOSCALED_INSTANCE_TYPE_RULE = AwsRule(
    "when you update an endpoint, Application Auto Scaling checks whether any of the models on that endpoint are "
    "targets for auto scaling; if the update would change the instance type for any model that is a target for "
    "auto scaling, the update fails",
    "https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html",
)
BLUE_GREEN_VARIANT_NAME_RULE = AwsRule(
    "when doing a blue/green or rolling deployment, your new endpoint configuration must have the same variant name "
    "as the old endpoint configuration",
    "https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-exclusions.html",
)
