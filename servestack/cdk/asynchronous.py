"""Async mode: submit API -> S3 + SQS -> worker Lambda (servestack/adapters/asynchronous.py); results in S3, job status
in DynamoDB (with TTL). A job's objects (everything under `async/<name>/`) expire with its record, after
`result_ttl_days`, by a lifecycle rule on the bucket.

Or, with `backend="sagemaker"`, a SageMaker async endpoint runs the jobs (GPU image on ml.g*/ml.p*, CPU image
otherwise): submit stores the payload and calls `InvokeEndpointAsync` (InferenceId = job id); SageMaker writes
the result under the results prefix (failures under the failures prefix) and publishes to a success or an error
SNS topic. Both topics feed a queue of their own (raw message delivery, with a DLQ), whose function
(`notification_handler`) records the outcome in the job table, so the status API answers as for the Lambda
backend. There is no worker and no jobs queue. The endpoint scales to zero: target tracking on
`ApproximateBacklogSizePerInstance` scales it, and AWS's documented recipe wakes it from zero: a step
scaling policy (+1 instance, lower bound 0) on an alarm of `HasBacklogWithoutCapacity` >= 1 (Average over
60 s, 2 of 2 periods), since target tracking cannot act while no instance reports a backlog per instance.

Handler contract (env): SERVESTACK_BUCKET, SERVESTACK_REQUEST_PREFIX, SERVESTACK_RESULT_PREFIX,
SERVESTACK_QUEUE_URL (the queue the function consumes), SERVESTACK_DEAD_LETTER_QUEUE_URL (the Lambda worker sends
what it gives up on there, with the reason), SERVESTACK_JOBS_TABLE (key `job_id`, TTL attribute `expires_at`,
epoch seconds), SERVESTACK_RESULT_TTL_DAYS, SERVESTACK_PRESIGN_THRESHOLD_BYTES (bodies above it get a presigned
S3 PUT URL), SERVESTACK_ASYNC_BACKEND (`lambda`|`sagemaker`) and, for sagemaker, SERVESTACK_ENDPOINT_NAME and
SERVESTACK_FAILURE_PREFIX.
"""

from __future__ import annotations

from aws_cdk import Annotations, Duration, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

import servestack.cdk.guardrails as guardrails
from servestack.aws_rules import LAMBDA_SYNC, SAGEMAKER_ASYNC
from servestack.cdk.bundling import FunctionCode
from servestack.cdk.realtime import (
    engine_environment,
    gpu_inference_ami,
    sagemaker_scaling_role,
    servestack_model,
    single_model_environment,
)
from servestack.cdk.scaling_guard import check_variants
from servestack.cdk.serverless import runtime_environment, servestack_function
from servestack.cdk.shared import (
    IamHttpApi,
    acknowledge,
    check_choice,
    check_range,
    endpoint_log_group,
    grant_sagemaker_logging,
    logical_id,
)
from servestack.spec import AlarmSettings, GpuSettings

SUBMIT_HANDLER = "handlers.asynchronous.submit_handler"
WORKER_HANDLER = "handlers.asynchronous.worker_handler"
NOTIFICATION_HANDLER = "handlers.asynchronous.notification_handler"
NOTIFIER_TIMEOUT_SEC = 30
_PREFIX_REASON = (
    "Object-level access is scoped to this deployment's own key prefix in its own bucket; job ids are only "
    "known at runtime, so the prefix ends in a wildcard."
)


# CDK's singleton that applies bucket notifications (a custom resource); its id is fixed by aws-cdk-lib.
_NOTIFICATIONS_HANDLER = "BucketNotificationsHandler050a0587b7544547bf325f094a3db834"
_BASIC_EXECUTION = "arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
_NOTIFICATIONS_REASON = (
    "CDK's bucket-notifications custom resource runs once per deployment with AWS's basic execution policy "
    "(write its own logs); it cannot be given another role through the S3 notification API."
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
        code: lambda_.Code | FunctionCode,
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
        max_payload_bytes: int | None = None,
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
        deployment: str | None = None,
        autoscaling: bool = True,
        gpu: GpuSettings | None = None,
    ) -> None:
        super().__init__(scope, id)
        # serving.yaml's `gpu:` (the spec allows it with backend: sagemaker on a GPU instance type only)
        self.gpu_environment = gpu.environment if gpu is not None else {}
        self.deployment = deployment or name
        self.autoscaling = autoscaling
        check_range("AsyncEndpoint", "batch_size", batch_size, 1, 10_000)
        check_range("AsyncEndpoint", "batch_window_sec", batch_window_sec, 1 if batch_size > 10 else 0, 300)
        check_range("AsyncEndpoint", "max_receive_count", max_receive_count, 1, 1000)
        check_range("AsyncEndpoint", "max_concurrency", max_concurrency, 2, 1000)
        check_range("AsyncEndpoint", "result_ttl_days", result_ttl_days, 1, 365)
        check_choice("AsyncEndpoint", "backend", backend, ("lambda", "sagemaker"))
        if backend == "sagemaker" and (image is None or model_data is None):
            raise ValueError("AsyncEndpoint: backend='sagemaker' needs image and model_data, got None")
        alarms = alarms or AlarmSettings()
        # The jobs' engine sets the payload limit (servestack/aws_rules.py): SageMaker async takes 1 GB, the Lambda
        # worker what a synchronous invocation takes. The functions themselves are invoked synchronously.
        engine = SAGEMAKER_ASYNC if backend == "sagemaker" else LAMBDA_SYNC
        max_payload_bytes = max_payload_bytes or engine.max_payload_bytes
        check_range("AsyncEndpoint", "max_payload_bytes", max_payload_bytes, 1, engine.max_payload_bytes)
        self.request_prefix = f"async/{name}/requests/"
        # Payloads over the presign threshold are PUT here by the caller (then confirmed, or, on the Lambda
        # backend, started by S3's notification).
        self.upload_prefix = f"{self.request_prefix}uploads/"
        self.result_prefix = f"async/{name}/results/"
        self.failure_prefix = f"async/{name}/failures/"
        self._expire_job_objects(bucket, f"async/{name}/", result_ttl_days)

        # `queue` feeds `worker`: the jobs for the Lambda worker, or SageMaker's notifications for the function
        # that records them (`<name>-notifications[-dlq]`).
        sagemaker_backend = backend == "sagemaker"
        self.dead_letters = sqs.Queue(
            self,
            "NotificationDeadLetters" if sagemaker_backend else "DeadLetters",
            queue_name=f"{name}-notifications-dlq" if sagemaker_backend else f"{name}-dlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        # AWS's guidance: visibility timeout >= 6x the function timeout (+ the batching window).
        consumer_timeout_sec = NOTIFIER_TIMEOUT_SEC if sagemaker_backend else timeout_sec
        self.queue = sqs.Queue(
            self,
            "Notifications" if sagemaker_backend else "Jobs",
            queue_name=f"{name}-notifications" if sagemaker_backend else f"{name}-jobs",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(6 * consumer_timeout_sec + batch_window_sec),
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
            max_payload_bytes=min(max_payload_bytes, LAMBDA_SYNC.max_payload_bytes),
            SERVESTACK_BUCKET=bucket.bucket_name,
            SERVESTACK_REQUEST_PREFIX=self.request_prefix,
            SERVESTACK_RESULT_PREFIX=self.result_prefix,
            SERVESTACK_QUEUE_URL=self.queue.queue_url,
            SERVESTACK_DEAD_LETTER_QUEUE_URL=self.dead_letters.queue_url,
            SERVESTACK_JOBS_TABLE=self.table.table_name,
            SERVESTACK_RESULT_TTL_DAYS=str(result_ttl_days),
            SERVESTACK_PRESIGN_THRESHOLD_BYTES=str(presign_threshold_bytes),
            SERVESTACK_ASYNC_BACKEND=backend,
            **(
                {"SERVESTACK_ENDPOINT_NAME": self.endpoint_name, "SERVESTACK_FAILURE_PREFIX": self.failure_prefix}
                if self.endpoint_name
                else {}
            ),
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
            description=f"servestack {name}: accept jobs, store payloads, enqueue (servestack.adapters.asynchronous)",
            function_name=f"{name}-submit",
        )
        if sagemaker_backend:
            self.worker = servestack_function(
                self,
                "Notifier",
                code=code,
                handler=NOTIFICATION_HANDLER,
                environment=env,
                memory_mib=512,
                timeout_sec=NOTIFIER_TIMEOUT_SEC,
                architecture=architecture,
                log_retention_days=log_retention_days,
                description=f"servestack {name}: record SageMaker's async notifications "
                "(servestack.adapters.asynchronous)",
            )
        else:
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
                description=f"servestack {name}: run queued jobs, write results (servestack.adapters.asynchronous)",
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

        if not sagemaker_backend:
            # Large uploads start when they land: an ObjectCreated notification on the upload prefix feeds the
            # job queue (CDK adds the queue policy that lets S3 send, scoped to this bucket). On the SageMaker
            # backend an upload starts with `POST /jobs/{id}/confirm`, which calls InvokeEndpointAsync.
            bucket.add_event_notification(
                s3.EventType.OBJECT_CREATED,
                s3n.SqsDestination(self.queue),
                s3.NotificationKeyFilter(prefix=self.upload_prefix),
            )
            handler = Stack.of(self).node.try_find_child(_NOTIFICATIONS_HANDLER)
            if handler is not None:
                acknowledge(handler, {f"AwsSolutions-IAM4[Policy::{_BASIC_EXECUTION}]": _NOTIFICATIONS_REASON})

        # Least privilege: each function touches only its own prefixes, queue and table, with exact actions.
        # Submit reads results (presigned GETs for the status API) and uploads (confirm checks one landed).
        upload_prefix = self.upload_prefix
        self._allow(self.submit, ["s3:PutObject"], [bucket.arn_for_objects(f"{self.request_prefix}*")])
        self._allow(
            self.submit,
            ["s3:GetObject"],
            [bucket.arn_for_objects(f"{self.result_prefix}*"), bucket.arn_for_objects(f"{upload_prefix}*")],
        )
        if sagemaker_backend:
            assert self.endpoint_name is not None
            endpoint_arn = Stack.of(self).format_arn(
                service="sagemaker", resource="endpoint", resource_name=self.endpoint_name.lower()
            )
            self._allow(self.submit, ["sagemaker:InvokeEndpointAsync"], [endpoint_arn])
            # the job record first, then where SageMaker will write its outcome
            self._allow(
                self.submit, ["dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem"], [self.table.table_arn]
            )
            self._allow(self.worker, ["dynamodb:UpdateItem", "dynamodb:GetItem"], [self.table.table_arn])
            self._allow(self.worker, ["s3:GetObject"], [bucket.arn_for_objects(f"{self.failure_prefix}*")])
        else:
            self._allow(self.submit, ["sqs:SendMessage"], [self.queue.queue_arn])
            self._allow(self.submit, ["dynamodb:PutItem", "dynamodb:GetItem"], [self.table.table_arn])
            self._allow(self.worker, ["s3:GetObject"], [bucket.arn_for_objects(f"{self.request_prefix}*")])
            self._allow(self.worker, ["s3:PutObject"], [bucket.arn_for_objects(f"{self.result_prefix}*")])
            # PutItem: the worker writes a job's whole record when it claims it (creating it, should submit have
            # died between sending the message and writing the record) and when it fails; BatchWriteItem: it
            # records a batch's successes in one call.
            self._allow(
                self.worker,
                ["dynamodb:BatchWriteItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"],
                [self.table.table_arn],
            )
            # The worker moves the messages it gives up on to the DLQ itself, with their reason as attributes
            # (SQS's own redrive moves a message unchanged, so it could carry none).
            self._allow(self.worker, ["sqs:SendMessage"], [self.dead_letters.queue_arn])
        bucket_id = logical_id(bucket)
        for fn in (self.submit, self.worker):
            assert fn.role is not None
            acknowledge(
                fn.role,
                {
                    f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{prefix}*]": _PREFIX_REASON
                    for prefix in (self.request_prefix, self.result_prefix, upload_prefix, self.failure_prefix)
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
            guardrails.function_failure_alarm(
                self, name=f"{name}-{'notifier' if sagemaker_backend else 'worker'}", function=self.worker
            ),
        ]

    def _expire_job_objects(self, bucket: s3.IBucket, prefix: str, days: int) -> None:
        """A job's objects (payload, upload, result, failure: all under `prefix`) go when its record does: the
        record's DynamoDB TTL is `days` after submit, and an S3 Expiration of `days` after each object's creation
        deletes them. The bucket is versioned, so an expiration leaves the object's bytes as a noncurrent version;
        those go a day later here, not after the bucket's general 30 days: nothing restores a job whose record is
        gone. S3 runs lifecycle once a day (an object goes at the next midnight UTC after its day count), and where
        two rules overlap "the shorter expiration policy is honored so that data is not stored for longer than
        expected" (https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-conflicts.html); the delete
        marker left behind is removed too once it is the object's only version
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-expire-general-considerations.html)."""
        if not isinstance(bucket, s3.Bucket):
            # An imported bucket's lifecycle is not this stack's to set.
            Annotations.of(self).add_warning_v2(
                "servestack:async-retention",
                f"bucket {bucket.node.path} is imported: add a lifecycle rule that expires {prefix} after {days} "
                "days, or the jobs' payloads and results stay after their records expire",
            )
            return
        bucket.add_lifecycle_rule(
            id=f"expire-{prefix.strip('/').replace('/', '-')}",
            prefix=prefix,
            expiration=Duration.days(days),
            noncurrent_version_expiration=Duration.days(1),
        )

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
        logs = endpoint_log_group(self, "EndpointLogs", endpoint_name=endpoint_name, retention_days=log_retention_days)
        sns_key = kms.Alias.from_alias_name(self, "SnsKey", "alias/aws/sns")
        self.success_topic = sns.Topic(self, "Succeeded", master_key=sns_key, enforce_ssl=True)
        self.error_topic = sns.Topic(self, "Failed", master_key=sns_key, enforce_ssl=True)
        for topic in (self.success_topic, self.error_topic):
            # Raw delivery: the queue message is SageMaker's notification itself, not an SNS envelope.
            topic.add_subscription(subscriptions.SqsSubscription(self.queue, raw_message_delivery=True))

        role = iam.Role(self, "EndpointRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        image.repository.grant_pull(role)
        grant_sagemaker_logging(role, logs)
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
        model = servestack_model(
            self,
            "Model",
            role=role,
            image_uri=image.image_uri,
            model_data_url=model_data.s3_object_url,
            environment={
                **single_model_environment(model_name),
                **engine_environment(SAGEMAKER_ASYNC, max_payload_bytes),
                **self.gpu_environment,
            },
        )
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
                    inference_ami_version=gpu_inference_ami(instance_type),
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
        # SageMaker refuses an instance type change of an autoscaled variant (servestack/cdk/scaling_guard.py).
        check_variants(
            self,
            deployment=self.deployment,
            endpoint_name=endpoint_name,
            instance_types={"AllTraffic": instance_type},
            blue_green=False,  # no DeploymentConfig, and its one variant keeps its name
        )
        if not self.autoscaling:
            return endpoint_name
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
        # AWS's recipe for scaling up from zero ("Autoscale an asynchronous endpoint", SageMaker developer
        # guide): a step policy adding one instance, run by an alarm on HasBacklogWithoutCapacity >= 1.
        wake = appscaling.StepScalingAction(
            self,
            "WakeFromZero",
            scaling_target=target,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            metric_aggregation_type=appscaling.MetricAggregationType.AVERAGE,
            cooldown=Duration.minutes(5),
        )
        wake.add_adjustment(adjustment=1, lower_bound=0)
        self.wake_alarm = cw.Alarm(
            self,
            "BacklogWithoutCapacityAlarm",
            alarm_name=f"{name}-backlog-without-capacity",
            alarm_description=f"{name}: jobs wait and no instance runs; adds one instance (scale from zero)",
            metric=cw.Metric(
                namespace="AWS/SageMaker",
                metric_name="HasBacklogWithoutCapacity",
                dimensions_map={"EndpointName": endpoint_name},
                statistic="Average",
                period=Duration.minutes(1),
            ),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=2,
            datapoints_to_alarm=2,
            treat_missing_data=cw.TreatMissingData.MISSING,
        )
        self.wake_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(wake))
        return endpoint_name
