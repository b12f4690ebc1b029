"""Async mode: submit API -> S3 + SQS -> worker Lambda (handlers/asynchronous.py); results in S3, job status
in DynamoDB (with TTL). Or, with `backend="sagemaker"`, a GPU SageMaker async endpoint that scales to zero
on backlog, whose SNS success/error notifications feed the same queue so the worker records the outcome.

Handler contract (env): SERVESTACK_BUCKET, SERVESTACK_REQUEST_PREFIX, SERVESTACK_RESULT_PREFIX,
SERVESTACK_QUEUE_URL, SERVESTACK_DEAD_LETTER_QUEUE_URL (the worker sends what it gives up on there, with the
reason), SERVESTACK_JOBS_TABLE (key `job_id`, TTL attribute `expires_at`, epoch seconds),
SERVESTACK_RESULT_TTL_DAYS, SERVESTACK_PRESIGN_THRESHOLD_BYTES (bodies above it get a presigned S3 PUT
URL), SERVESTACK_ASYNC_BACKEND (`lambda`|`sagemaker`) and, for sagemaker, SERVESTACK_ENDPOINT_NAME.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from servestack.spec import AlarmSettings
from stacks import guardrails
from stacks.realtime import CONTAINER_MODEL_DIR, sagemaker_scaling_role
from stacks.serverless import runtime_environment, servestack_function
from stacks.shared import IamHttpApi, acknowledge, check_choice, check_range, log_group, logical_id

SUBMIT_HANDLER = "handlers.asynchronous.submit_handler"
WORKER_HANDLER = "handlers.asynchronous.worker_handler"
_PREFIX_REASON = (
    "Object-level access is scoped to this deployment's own key prefix in its own bucket; job ids are only "
    "known at runtime, so the prefix ends in a wildcard."
)


class AsyncEndpoint(Construct):
    """Submit Lambda behind an IAM-authenticated HTTP API, an encrypted SQS queue with a DLQ, a worker Lambda
    reporting partial batch failures, a DynamoDB job table with TTL, and alarms on DLQ depth and queue age."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        name: str,
        code: lambda_.Code,
        bucket: s3.IBucket,
        model_name: str,
        batch_size: int = 10,
        batch_window_sec: int = 1,
        max_receive_count: int = 3,
        max_concurrency: int = 10,
        memory_mib: int = 2048,
        timeout_sec: int = 120,
        architecture: str = "x86_64",
        result_ttl_days: int = 7,
        presign_threshold_bytes: int = 262_144,
        max_payload_bytes: int = 6_291_456,
        log_retention_days: int = 30,
        throttle_rate_per_sec: int = 50,
        throttle_burst: int = 100,
        alarms: AlarmSettings | None = None,
        backend: str = "lambda",
        image: ecr_assets.DockerImageAsset | None = None,
        model_data: s3_assets.Asset | None = None,
        instance_type: str = "ml.g5.xlarge",
        max_instances: int = 2,
        target_backlog_per_instance: int = 5,
    ) -> None:
        super().__init__(scope, id)
        check_range("AsyncEndpoint", "batch_size", batch_size, 1, 10_000)
        check_range("AsyncEndpoint", "batch_window_sec", batch_window_sec, 1 if batch_size > 10 else 0, 300)
        check_range("AsyncEndpoint", "max_receive_count", max_receive_count, 1, 1000)
        check_range("AsyncEndpoint", "max_concurrency", max_concurrency, 2, 1000)
        check_range("AsyncEndpoint", "result_ttl_days", result_ttl_days, 1, 365)
        check_choice("AsyncEndpoint", "backend", backend, ("lambda", "sagemaker"))
        if backend == "sagemaker" and (image is None or model_data is None):
            raise ValueError("AsyncEndpoint: backend='sagemaker' needs image and model_data, got None")
        alarms = alarms or AlarmSettings()
        self.request_prefix = f"async/{name}/requests/"
        self.result_prefix = f"async/{name}/results/"
        self.failure_prefix = f"async/{name}/failures/"

        # Physical names follow servestack.local.resources.names(), so `local up` creates the same ones.
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            queue_name=f"{name}-dlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        # AWS's guidance: visibility timeout >= 6x the function timeout (+ the batching window).
        self.queue = sqs.Queue(
            self,
            "Jobs",
            queue_name=f"{name}-jobs",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(6 * timeout_sec + batch_window_sec),
            retention_period=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=max_receive_count, queue=self.dead_letters),
        )
        self.table = dynamodb.Table(
            self,
            "JobTable",
            table_name=f"{name}-jobs",
            partition_key=dynamodb.Attribute(name="job_id", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute="expires_at",
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
        )

        self.endpoint_name: str | None = None
        if backend == "sagemaker":
            assert image is not None
            assert model_data is not None
            self.endpoint_name = self._sagemaker_backend(
                name, bucket, image, model_data, model_name, instance_type, max_instances,
                target_backlog_per_instance, max_payload_bytes, log_retention_days,
            )  # fmt: skip

        env = runtime_environment(
            model_name=model_name,
            max_payload_bytes=max_payload_bytes,
            SERVESTACK_BUCKET=bucket.bucket_name,
            SERVESTACK_REQUEST_PREFIX=self.request_prefix,
            SERVESTACK_RESULT_PREFIX=self.result_prefix,
            SERVESTACK_QUEUE_URL=self.queue.queue_url,
            SERVESTACK_DEAD_LETTER_QUEUE_URL=self.dead_letters.queue_url,
            SERVESTACK_JOBS_TABLE=self.table.table_name,
            SERVESTACK_RESULT_TTL_DAYS=str(result_ttl_days),
            SERVESTACK_PRESIGN_THRESHOLD_BYTES=str(presign_threshold_bytes),
            SERVESTACK_ASYNC_BACKEND=backend,
            **({"SERVESTACK_ENDPOINT_NAME": self.endpoint_name} if self.endpoint_name else {}),
        )
        self.submit = servestack_function(
            self,
            "Submit",
            code=code,
            handler=SUBMIT_HANDLER,
            environment=env,
            memory_mib=512,
            timeout_sec=15,
            architecture=architecture,
            log_retention_days=log_retention_days,
            description=f"servestack {name}: accept jobs, store payloads, enqueue (handlers.asynchronous)",
        )
        self.worker = servestack_function(
            self,
            "Worker",
            code=code,
            handler=WORKER_HANDLER,
            environment=env,
            memory_mib=memory_mib,
            timeout_sec=timeout_sec,
            architecture=architecture,
            log_retention_days=log_retention_days,
            description=f"servestack {name}: run queued jobs, write results (handlers.asynchronous)",
        )
        self.worker.add_event_source(
            sources.SqsEventSource(
                self.queue,
                batch_size=batch_size,
                max_batching_window=Duration.seconds(batch_window_sec),
                report_batch_item_failures=True,
                max_concurrency=max_concurrency,
            )
        )

        # Least privilege: each function touches only its own prefixes, queue and table, with exact actions.
        self._allow(self.submit, ["s3:PutObject"], [bucket.arn_for_objects(f"{self.request_prefix}*")])
        self._allow(self.submit, ["s3:GetObject"], [bucket.arn_for_objects(f"{self.result_prefix}*")])
        self._allow(self.submit, ["sqs:SendMessage"], [self.queue.queue_arn])
        self._allow(self.submit, ["dynamodb:PutItem", "dynamodb:GetItem"], [self.table.table_arn])
        self._allow(self.worker, ["s3:GetObject"], [bucket.arn_for_objects(f"{self.request_prefix}*")])
        self._allow(self.worker, ["s3:PutObject"], [bucket.arn_for_objects(f"{self.result_prefix}*")])
        # PutItem: the worker writes a job's whole record when it claims it (creating it, should submit have
        # died between sending the message and writing the record) and when it fails; BatchWriteItem: it records
        # a batch's successes in one call.
        self._allow(
            self.worker,
            ["dynamodb:BatchWriteItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"],
            [self.table.table_arn],
        )
        # The worker moves the messages it gives up on to the DLQ itself, with their reason as attributes
        # (SQS's own redrive moves a message unchanged, so it could carry none).
        self._allow(self.worker, ["sqs:SendMessage"], [self.dead_letters.queue_arn])
        if self.endpoint_name:
            endpoint_arn = Stack.of(self).format_arn(
                service="sagemaker", resource="endpoint", resource_name=self.endpoint_name.lower()
            )
            self._allow(self.submit, ["sagemaker:InvokeEndpointAsync"], [endpoint_arn])
        bucket_id = logical_id(bucket)
        for fn in (self.submit, self.worker):
            assert fn.role is not None
            acknowledge(
                fn.role,
                {
                    f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.request_prefix}*]": _PREFIX_REASON,
                    f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.result_prefix}*]": _PREFIX_REASON,
                },
            )

        self.http = IamHttpApi(
            self,
            "Http",
            handler=self.submit,
            throttle_rate_per_sec=throttle_rate_per_sec,
            throttle_burst=throttle_burst,
            log_retention_days=log_retention_days,
        )
        self.alarms = [
            guardrails.dead_letter_alarm(self, name=name, dlq=self.dead_letters),
            guardrails.queue_age_alarm(self, name=name, queue=self.queue, settings=alarms),
            guardrails.function_failure_alarm(self, name=f"{name}-worker", function=self.worker),
        ]

    @staticmethod
    def _allow(fn: lambda_.Function, actions: list[str], resources: list[str]) -> None:
        fn.add_to_role_policy(iam.PolicyStatement(actions=actions, resources=resources))

    def _sagemaker_backend(
        self,
        name: str,
        bucket: s3.IBucket,
        image: ecr_assets.DockerImageAsset,
        model_data: s3_assets.Asset,
        model_name: str,
        instance_type: str,
        max_instances: int,
        target_backlog_per_instance: int,
        max_payload_bytes: int,
        log_retention_days: int,
    ) -> str:
        check_range("AsyncEndpoint", "max_instances", max_instances, 1, 100)
        endpoint_name = name
        logs = log_group(self, "EndpointLogs", retention_days=log_retention_days)
        logs.node.default_child.add_property_override(  # type: ignore[union-attr]
            "LogGroupName", f"/aws/sagemaker/Endpoints/{endpoint_name}"
        )
        sns_key = kms.Alias.from_alias_name(self, "SnsKey", "alias/aws/sns")
        self.success_topic = sns.Topic(self, "Succeeded", master_key=sns_key, enforce_ssl=True)
        self.error_topic = sns.Topic(self, "Failed", master_key=sns_key, enforce_ssl=True)
        for topic in (self.success_topic, self.error_topic):
            topic.add_subscription(subscriptions.SqsSubscription(self.queue, raw_message_delivery=True))

        role = iam.Role(self, "EndpointRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        image.repository.grant_pull(role)
        logs.grant_write(role)
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[
                    model_data.bucket.arn_for_objects(model_data.s3_object_key),
                    bucket.arn_for_objects(f"{self.request_prefix}*"),
                ],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:PutObject"],
                resources=[
                    bucket.arn_for_objects(f"{self.result_prefix}*"),
                    bucket.arn_for_objects(f"{self.failure_prefix}*"),
                ],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["sns:Publish"], resources=[self.success_topic.topic_arn, self.error_topic.topic_arn]
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/Endpoints*"}},
            )
        )
        bucket_id = logical_id(bucket)
        acknowledge(
            role,
            {
                "AwsSolutions-IAM5[Resource::*]": (
                    "ecr:GetAuthorizationToken and cloudwatch:PutMetricData have no resource-level "
                    "permissions (the latter is limited to the SageMaker namespace by a condition)."
                ),
                f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.request_prefix}*]": _PREFIX_REASON,
                f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.result_prefix}*]": _PREFIX_REASON,
                f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.failure_prefix}*]": _PREFIX_REASON,
            },
        )
        model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=role.role_arn,
            enable_network_isolation=True,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=image.image_uri,
                model_data_url=model_data.s3_object_url,
                environment={
                    "SERVESTACK_MODEL_DIR": CONTAINER_MODEL_DIR,
                    "SERVESTACK_DEFAULT_MODEL": model_name,
                    "SERVESTACK_PROVIDERS": "auto",
                    "SERVESTACK_MAX_PAYLOAD_BYTES": str(max_payload_bytes),
                },
            ),
        )
        model.node.add_dependency(role)
        config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name="AllTraffic",
                    model_name=model.attr_model_name,
                    instance_type=instance_type,
                    initial_instance_count=1,
                    initial_variant_weight=1.0,
                )
            ],
            async_inference_config=sagemaker.CfnEndpointConfig.AsyncInferenceConfigProperty(
                output_config=sagemaker.CfnEndpointConfig.AsyncInferenceOutputConfigProperty(
                    s3_output_path=bucket.s3_url_for_object(self.result_prefix),
                    s3_failure_path=bucket.s3_url_for_object(self.failure_prefix),
                    notification_config=sagemaker.CfnEndpointConfig.AsyncInferenceNotificationConfigProperty(
                        success_topic=self.success_topic.topic_arn,
                        error_topic=self.error_topic.topic_arn,
                        include_inference_response_in=["SUCCESS_NOTIFICATION_TOPIC"],
                    ),
                ),
                client_config=sagemaker.CfnEndpointConfig.AsyncInferenceClientConfigProperty(
                    max_concurrent_invocations_per_instance=4
                ),
            ),
        )
        endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_name=endpoint_name,
            endpoint_config_name=config.attr_endpoint_config_name,
        )
        # Scale to zero when idle: track backlog per instance, and wake up from zero on any backlog.
        target = appscaling.ScalableTarget(
            self,
            "EndpointScaling",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=f"endpoint/{endpoint_name}/variant/AllTraffic",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            min_capacity=0,
            max_capacity=max_instances,
            role=sagemaker_scaling_role(self, "ScalingRole"),
        )
        target.node.add_dependency(endpoint)
        target.scale_to_track_metric(
            "BacklogPerInstance",
            target_value=target_backlog_per_instance,
            custom_metric=cw.Metric(
                namespace="AWS/SageMaker",
                metric_name="ApproximateBacklogSizePerInstance",
                dimensions_map={"EndpointName": endpoint_name},
                statistic="Average",
                period=Duration.minutes(1),
            ),
            scale_in_cooldown=Duration.minutes(10),
            scale_out_cooldown=Duration.minutes(1),
        )
        target.scale_on_metric(
            "WakeFromZero",
            metric=cw.Metric(
                namespace="AWS/SageMaker",
                metric_name="HasBacklogWithoutCapacity",
                dimensions_map={"EndpointName": endpoint_name},
                statistic="Average",
                period=Duration.minutes(1),
            ),
            scaling_steps=[
                appscaling.ScalingInterval(upper=0.5, change=0),
                appscaling.ScalingInterval(lower=0.5, change=1),
            ],
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            cooldown=Duration.minutes(2),
        )
        return endpoint_name
