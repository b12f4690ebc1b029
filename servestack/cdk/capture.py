"""Data capture in AWS (docs/monitoring.md): SageMaker's own for realtime endpoints (`data_capture_config`), and
for everything whose code writes capture log lines (servestack/inference/capture.py) a CloudWatch Logs
subscription into a Kinesis Data Firehose stream that writes them to the capture prefix (`LogCapture`).

Firehose decompresses what CloudWatch Logs sends and keeps only each event's message (its built-in processors: no
Lambda transform), one record a line, so the objects under the prefix are JSON Lines of capture log lines.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesisfirehose as firehose
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from servestack.cdk.shared import acknowledge, logical_id
from servestack.spec import Capture


def filter_pattern(deployment: str) -> str:
    """The capture lines among a log group's events (its other lines: logs, EMF metrics): JSON records whose
    `servestack.deployment` is this deployment's."""
    return f'{{ $.servestack.deployment = "{deployment}" }}'


# Firehose buffers up to this long or this much before writing an object (its defaults: 300 s, 5 MiB).
BUFFER_SECONDS = 60
BUFFER_MIB = 5
FILE_EXTENSION = ".jsonl"


def errors_prefix(prefix: str) -> str:
    """Where Firehose writes the records it could not process: `capture/<deployment>-errors/`."""
    return f"{prefix.rstrip('/')}-errors/"


def capture_environment(capture: Capture, *, deployment: str, mode: str) -> dict[str, str]:
    """`SERVESTACK_CAPTURE` for the code that captures (servestack/inference/capture.py's `CaptureSetting`)."""
    setting = {
        "deployment": deployment,
        "mode": mode,
        "sample_percent": capture.sample_percent,
        "what": capture.what,
        "exclude_columns": list(capture.exclude_columns),
    }
    return {"SERVESTACK_CAPTURE": json.dumps(setting, separators=(",", ":"))}


def native_capture(capture: Capture) -> bool:
    """Whether SageMaker captures a realtime endpoint itself: it records bodies as they are, so an endpoint that
    leaves columns out captures through its container's log lines instead."""
    return not capture.exclude_columns


def data_capture_config(
    capture: Capture, bucket: s3.IBucket, prefix: str, role: iam.IRole
) -> sagemaker.CfnEndpointConfig.DataCaptureConfigProperty:
    """SageMaker's own capture into `s3://<bucket>/<prefix>`, written with the endpoint's execution `role`
    (granted `s3:PutObject` on the prefix here; the bucket is SSE-S3, so no key to grant)."""
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["s3:PutObject"], resources=[bucket.arn_for_objects(f"{prefix}*")])
    )
    acknowledge(role, {f"AwsSolutions-IAM5[Resource::<{logical_id(bucket)}.Arn>/{prefix}*]": PREFIX_REASON})
    options = {"inputs": ["Input"], "outputs": ["Output"], "both": ["Input", "Output"]}[capture.what]
    return sagemaker.CfnEndpointConfig.DataCaptureConfigProperty(
        enable_capture=True,
        # SageMaker takes whole percents (0..100); a fraction is rounded up so that a small share stays captured.
        initial_sampling_percentage=min(100, -(-int(capture.sample_percent * 1000) // 1000)),
        destination_s3_uri=bucket.s3_url_for_object(prefix.rstrip("/")),
        capture_options=[sagemaker.CfnEndpointConfig.CaptureOptionProperty(capture_mode=m) for m in options],
        capture_content_type_header=sagemaker.CfnEndpointConfig.CaptureContentTypeHeaderProperty(
            json_content_types=["application/json"], csv_content_types=["text/csv"]
        ),
    )


class LogCapture(Construct):
    """The capture lines of `log_groups`, delivered to `s3://<bucket>/<prefix>` by a Firehose stream: a
    subscription filter per group (CloudWatch Logs assumes `subscription_role`, which may only put records on
    this stream), and the stream's own role, which may only write under the prefix."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        log_groups: Sequence[logs.ILogGroup],
        bucket: s3.IBucket,
        prefix: str,
        stream_name: str,
        deployment: str,
    ) -> None:
        super().__init__(scope, id)
        self.prefix = prefix
        self.delivery_role = iam.Role(
            self,
            "DeliveryRole",
            assumed_by=iam.ServicePrincipal(
                "firehose.amazonaws.com", conditions={"StringEquals": {"sts:ExternalId": Aws.ACCOUNT_ID}}
            ),
            description=f"Firehose {stream_name}: write capture records under s3://<bucket>/{prefix}",
        )
        self.delivery_role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:AbortMultipartUpload", "s3:PutObject"],
                resources=[bucket.arn_for_objects(f"{prefix}*"), bucket.arn_for_objects(f"{errors_prefix(prefix)}*")],
            )
        )
        self.delivery_role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
                resources=[bucket.bucket_arn],
            )
        )
        errors = logs.LogGroup(self, "DeliveryLogs", retention=logs.RetentionDays.ONE_MONTH)
        errors_stream = errors.add_stream("S3Delivery")
        errors.grant_write(self.delivery_role)
        processor = firehose.CfnDeliveryStream.ProcessorProperty
        parameter = firehose.CfnDeliveryStream.ProcessorParameterProperty
        self.stream = firehose.CfnDeliveryStream(
            self,
            "Stream",
            delivery_stream_name=stream_name,
            delivery_stream_type="DirectPut",
            delivery_stream_encryption_configuration_input=firehose.CfnDeliveryStream.DeliveryStreamEncryptionConfigurationInputProperty(
                key_type="AWS_OWNED_CMK"
            ),
            extended_s3_destination_configuration=firehose.CfnDeliveryStream.ExtendedS3DestinationConfigurationProperty(
                bucket_arn=bucket.bucket_arn,
                role_arn=self.delivery_role.role_arn,
                prefix=f"{prefix}!{{timestamp:yyyy/MM/dd/HH}}/",
                # Failed records go beside the prefix, not under it: a reader of the prefix sees records only.
                error_output_prefix=f"{errors_prefix(prefix)}!{{firehose:error-output-type}}/!{{timestamp:yyyy/MM/dd/HH}}/",
                # `.jsonl`, as SageMaker names its capture files (what `servestack monitor` reads under a prefix)
                file_extension=FILE_EXTENSION,
                buffering_hints=firehose.CfnDeliveryStream.BufferingHintsProperty(
                    interval_in_seconds=BUFFER_SECONDS, size_in_m_bs=BUFFER_MIB
                ),
                compression_format="UNCOMPRESSED",
                cloud_watch_logging_options=firehose.CfnDeliveryStream.CloudWatchLoggingOptionsProperty(
                    enabled=True, log_group_name=errors.log_group_name, log_stream_name=errors_stream.log_stream_name
                ),
                processing_configuration=firehose.CfnDeliveryStream.ProcessingConfigurationProperty(
                    enabled=True,
                    processors=[
                        processor(
                            type="Decompression",
                            parameters=[parameter(parameter_name="CompressionFormat", parameter_value="GZIP")],
                        ),
                        processor(
                            type="CloudWatchLogProcessing",
                            parameters=[parameter(parameter_name="DataMessageExtraction", parameter_value="true")],
                        ),
                        processor(type="AppendDelimiterToRecord"),
                    ],
                ),
            ),
        )
        self.stream.node.add_dependency(self.delivery_role)
        self.subscription_role = iam.Role(
            self,
            "SubscriptionRole",
            assumed_by=iam.ServicePrincipal(
                "logs.amazonaws.com",
                conditions={
                    "StringLike": {"aws:SourceArn": f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:*"}
                },
            ),
            description=f"CloudWatch Logs: hand capture lines to the Firehose stream {stream_name}",
        )
        self.subscription_role.add_to_policy(
            iam.PolicyStatement(
                actions=["firehose:PutRecord", "firehose:PutRecordBatch"], resources=[self.stream.attr_arn]
            )
        )
        self.filters: list[logs.CfnSubscriptionFilter] = []
        for i, group in enumerate(log_groups):
            found = logs.CfnSubscriptionFilter(
                self,
                f"Subscription{i}",
                log_group_name=group.log_group_name,
                filter_pattern=filter_pattern(deployment),
                destination_arn=self.stream.attr_arn,
                role_arn=self.subscription_role.role_arn,
            )
            found.node.add_dependency(self.subscription_role)
            self.filters.append(found)
        bucket_id = logical_id(bucket)
        acknowledge(
            self.delivery_role,
            {
                f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{prefix}*]": PREFIX_REASON,
                f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{errors_prefix(prefix)}*]": PREFIX_REASON,
            },
        )


PREFIX_REASON = (
    "capture objects are written one per buffer (Firehose) or per request batch (SageMaker) under the capture "
    "prefix, keyed by time: the prefix is the narrowest resource"
)
