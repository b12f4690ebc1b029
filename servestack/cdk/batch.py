"""Batch mode: an EventBridge Scheduler schedule (cron or rate, with a time zone) that runs servestack/adapters/batch.py
over every object under the input prefix and writes predictions under the output prefix.

Short jobs run on Lambda (`servestack.adapters.batch.handler`); long ones on ECS Fargate with the same code in the CPU
container (`python -m handlers.batch`, the project's entry around servestack/adapters/batch.py `main`). The
schedule's target has a retry policy and a dead-letter queue.

Each deployment's schedule lives in a schedule group of its own, so that Scheduler's `TargetErrorCount` with the
`ScheduleGroup` dimension counts this deployment's target errors and no other schedule's of the account
(https://docs.aws.amazon.com/scheduler/latest/UserGuide/monitoring-cloudwatch.html: the metrics' one dimension is
the schedule group). The failure alarm adds those to the failed runs and the dead letters. A failed run is, per
engine: the function's `Errors` (Lambda; the transform job's manifest step, which raises for a failed job); for
Fargate, where RunTask succeeds whatever the task's exit code, an EventBridge rule on this deployment's cluster's
"ECS Task State Change" events (STOPPED, with a container's non-zero exit code or a task that failed to start),
counted by the rule's `TriggeredRules` metric (AWS/Events, `RuleName` dimension).

`runner="transform"` (data that outgrows one machine): the schedule's target is EventBridge Scheduler's
universal target for SageMaker's CreateTransformJob API, which runs a Batch Transform job of the realtime
image and model over `instance_count` instances (`SplitType: Line`, `BatchStrategy: MultiRecord`); the job's
name is `<name>-<aws.scheduler.execution-id>`, unique per run. CloudFormation has no transform-job resource,
so nothing is created at deploy time but the model. When the job ends, SageMaker's "SageMaker Transform Job
State Change" event runs a small function (`servestack.adapters.batch.transform_done`) that writes the manifest and the
error file as the other runners do (servestack/inference/tabular/transform.py says where Transform's semantics differ).

Handler contract: the scheduled payload is {"deployment", "bucket", "input_prefix", "output_prefix",
"model"}; on Fargate the same values arrive as SERVESTACK_BATCH_* environment variables.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, TimeZone
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as events_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from servestack.cdk.bundling import FunctionCode
from servestack.cdk.realtime import servestack_model, single_model_environment
from servestack.cdk.schedule_failures import schedule_dead_letters, schedule_failure_alarm
from servestack.cdk.serverless import runtime_environment, servestack_function
from servestack.cdk.shared import acknowledge, check_choice, check_range, log_group, logical_id
from servestack.cdk.transform_job import transform_role, transform_target
from servestack.spec import GpuSettings

HANDLER = "handlers.batch.handler"
TRANSFORM_DONE_HANDLER = "handlers.batch.transform_done"
RUNNERS = ("lambda", "fargate", "transform")
# The realtime image reads its model from here (containers/*.Dockerfile, servestack/cdk/realtime.py).
# Universal target: EventBridge Scheduler calls the AWS SDK action itself (no function in between).
CREATE_TRANSFORM_JOB_TARGET = "arn:aws:scheduler:::aws-sdk:sagemaker:createTransformJob"
# TransformJobName: at most 63 characters of [a-zA-Z0-9-]; the execution id is 16 ("d32c5kddcf5bb8c3").
_JOB_NAME_MAX = 63 - len("-") - 16
_TRANSFORM_CONTENT_TYPES = {"jsonl": "application/jsonlines", "csv": "text/csv"}
FARGATE_COMMAND = ["python", "-m", "handlers.batch"]
_ARCH = {"x86_64": ecs.CpuArchitecture.X86_64, "arm64": ecs.CpuArchitecture.ARM64}
_PREFIX_REASON = (
    "Object-level access is scoped to this deployment's own input/output prefixes in its own bucket; the "
    "object names are only known at runtime, so each prefix ends in a wildcard."
)


class BatchJob(Construct):
    """A scheduled batch-scoring job on Lambda or Fargate, with retries, a DLQ and a failure alarm."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        name: str,
        bucket: s3.IBucket,
        model_name: str,
        schedule: str = "cron(0 3 * * ? *)",
        timezone: str = "UTC",
        input_prefix: str | None = None,
        output_prefix: str | None = None,
        runner: str = "lambda",
        code: lambda_.Code | FunctionCode | None = None,
        image: ecr_assets.DockerImageAsset | None = None,
        model_dir: str | None = None,
        model_data: s3_assets.Asset | None = None,
        input_format: str | None = None,
        output_format: str = "jsonl",
        id_column: str | None = None,
        max_record_bytes: int = 1024 * 1024,
        instance_type: str = "ml.m5.xlarge",
        instance_count: int = 1,
        max_payload_mb: int = 6,
        max_concurrent_transforms: int = 2,
        transform_timeout_sec: int = 600,
        memory_mib: int = 2048,
        timeout_sec: int = 900,
        architecture: str = "x86_64",
        fargate_cpu: int = 1024,
        fargate_memory_mib: int = 4096,
        retry_attempts: int = 2,
        max_event_age_sec: int = 3600,
        max_payload_bytes: int = 6_291_456,
        log_retention_days: int = 30,
        gpu: GpuSettings | None = None,
    ) -> None:
        super().__init__(scope, id)
        # serving.yaml's `gpu:` (the spec allows it with runner: transform on a GPU instance type only, and refuses
        # those while no Batch Transform host AMI runs the CUDA 13 image: servestack/gpu_families.py)
        self.gpu_environment = gpu.environment if gpu is not None else {}
        check_choice("BatchJob", "runner", runner, RUNNERS)
        check_range("BatchJob", "retry_attempts", retry_attempts, 0, 185)
        check_range("BatchJob", "max_event_age_sec", max_event_age_sec, 60, 86_400)
        if not schedule.startswith(("cron(", "rate(")):
            raise ValueError(f"BatchJob: schedule={schedule!r} is not 'cron(...)' or 'rate(...)'")
        if runner == "lambda" and code is None:
            raise ValueError("BatchJob: runner='lambda' needs code, got None")
        if runner == "fargate" and image is None:
            raise ValueError("BatchJob: runner='fargate' needs image, got None")
        if runner == "transform" and (image is None or model_data is None or code is None):
            raise ValueError("BatchJob: runner='transform' needs image, model_data and code, got None")
        self.input_prefix = input_prefix or f"batch/{name}/input/"
        self.output_prefix = output_prefix or f"batch/{name}/output/"
        payload = {
            "deployment": name,
            "bucket": bucket.bucket_name,
            "input_prefix": self.input_prefix,
            "output_prefix": self.output_prefix,
            "model": model_name,
        }
        # Only when not the default, so that templates of deployments that do not set them stay as they were.
        if input_format is not None:
            payload["input_format"] = input_format
        if output_format != "jsonl":
            payload["output_format"] = output_format
        if id_column is not None:
            payload["id_column"] = id_column
        if max_record_bytes != 1024 * 1024:
            payload["max_record_bytes"] = str(max_record_bytes)
        self.dead_letters = schedule_dead_letters(self, "schedule target")
        bucket_id = logical_id(bucket)
        prefix_findings = {
            f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.input_prefix}*]": _PREFIX_REASON,
            f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{self.output_prefix}*]": _PREFIX_REASON,
        }
        read_input = iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{self.input_prefix}*")]
        )
        list_input = iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{self.input_prefix}*"]}},
        )
        # The job owns its output prefix: it lists and reads back its parts to resume a crashed run without
        # duplicates, and deletes stale parts and the error parts of rows that later succeeded.
        write_output = iam.PolicyStatement(
            actions=["s3:PutObject", "s3:GetObject", "s3:DeleteObject"],
            resources=[bucket.arn_for_objects(f"{self.output_prefix}*")],
        )
        list_output = iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{self.output_prefix}*"]}},
        )
        self.function: lambda_.Function | None = None
        self.task_definition: ecs.FargateTaskDefinition | None = None
        self.task_failed: events.Rule | None = None  # Fargate: the rule on this cluster's failed tasks
        target: scheduler.IScheduleTarget
        if runner == "lambda":
            assert code is not None
            self.function = servestack_function(
                self,
                "Function",
                code=code,
                handler=HANDLER,
                environment=runtime_environment(model_name=model_name, max_payload_bytes=max_payload_bytes),
                memory_mib=memory_mib,
                timeout_sec=timeout_sec,
                architecture=architecture,
                log_retention_days=log_retention_days,
                description=f"servestack {name}: scheduled batch scoring (servestack.adapters.batch)",
            )
            for statement in (read_input, list_input, write_output, list_output):
                self.function.add_to_role_policy(statement)
            assert self.function.role is not None
            acknowledge(self.function.role, prefix_findings)
            scheduler_role = iam.Role(self, "SchedulerRole", assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"))
            acknowledge(
                scheduler_role,
                {
                    f"AwsSolutions-IAM5[Resource::<{logical_id(self.function)}.Arn>:*]": (
                        "CDK's invoke grant also covers this one function's versions and aliases "
                        "(`<arn>:*`); the role can invoke nothing else."
                    )
                },
            )
            target = targets.LambdaInvoke(
                self.function,
                role=scheduler_role,
                input=scheduler.ScheduleTargetInput.from_object(payload),
                dead_letter_queue=self.dead_letters,
                retry_attempts=retry_attempts,
                max_event_age=Duration.seconds(max_event_age_sec),
            )
            failures: cw.IMetric = self.function.metric_errors(period=Duration.minutes(5), statistic="Sum")
        elif runner == "transform":
            assert image is not None
            assert model_data is not None
            assert code is not None
            target, failures = self._transform(
                name, bucket, image, model_data, code, payload, model_name, input_format or "jsonl",
                instance_type, instance_count, max_payload_mb, max_concurrent_transforms, transform_timeout_sec,
                memory_mib, architecture, max_payload_bytes, log_retention_days,
                (read_input, list_input, write_output, list_output), prefix_findings, retry_attempts,
                max_event_age_sec,
            )  # fmt: skip
        else:
            assert image is not None
            target, failures = self._fargate(
                name, image, model_dir, payload, model_name, fargate_cpu, fargate_memory_mib, architecture,
                log_retention_days, (read_input, list_input, write_output, list_output), prefix_findings,
                retry_attempts, max_event_age_sec,
            )  # fmt: skip

        # The deployment's own group: Scheduler's metrics have the group as their one dimension, so the alarm
        # below counts this deployment's target errors, never another schedule's of the account.
        self.schedule_group = scheduler.ScheduleGroup(
            self, "ScheduleGroup", schedule_group_name=name, removal_policy=RemovalPolicy.DESTROY
        )
        self.schedule = scheduler.Schedule(
            self,
            "Schedule",
            # Named, so that the pipeline's smoke test can be granted GetSchedule on this schedule alone.
            schedule_name=name,
            schedule_group=self.schedule_group,
            schedule=scheduler.ScheduleExpression.expression(schedule, TimeZone.of(timezone)),
            target=target,
            description=f"servestack {name}: batch scoring of s3://<bucket>/{self.input_prefix}",
        )
        # The schedule names its group by a plain string: without this, CloudFormation may create it first.
        self.schedule.node.add_dependency(self.schedule_group)
        self.alarm = schedule_failure_alarm(
            self,
            alarm_name=f"{name}-failures",
            description=(
                f"{name}: a batch run failed, its schedule could not start it, or its invocation was dead-lettered"
            ),
            failures=failures,
            schedule_group=self.schedule_group,
            dead_letters=self.dead_letters,
            label="failed runs + target errors + dead letters",
        )
        self.alarms = [self.alarm]

    def _fargate(
        self,
        name: str,
        image: ecr_assets.DockerImageAsset,
        model_dir: str | None,
        payload: dict[str, str],
        model_name: str,
        cpu: int,
        memory_mib: int,
        architecture: str,
        log_retention_days: int,
        statements: tuple[iam.PolicyStatement, ...],
        prefix_findings: dict[str, str],
        retry_attempts: int,
        max_event_age_sec: int,
    ) -> tuple[scheduler.IScheduleTarget, cw.IMetric]:
        check_choice("BatchJob", "fargate_cpu", cpu, (256, 512, 1024, 2048, 4096, 8192, 16384))
        # Public subnets only: the task pulls its image and reaches S3 without NAT gateways (no idle cost).
        flow_logs = log_group(self, "FlowLogs", retention_days=log_retention_days)
        vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC)],
            flow_logs={
                "Rejected": ec2.FlowLogOptions(
                    traffic_type=ec2.FlowLogTrafficType.REJECT,
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                )
            },
        )
        vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        cluster = ecs.Cluster(self, "Cluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENABLED)
        task = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=cpu,
            memory_limit_mib=memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=_ARCH[architecture], operating_system_family=ecs.OperatingSystemFamily.LINUX
            ),
        )
        logs = log_group(self, "TaskLogs", retention_days=log_retention_days)
        task.add_container(
            "batch",
            image=ecs.ContainerImage.from_docker_image_asset(image),
            # The image's ENTRYPOINT is the realtime `serve`; a batch run replaces it.
            entry_point=FARGATE_COMMAND,
            environment={
                # Where the image carries its model packages (servestack/cdk/images.py); without it, the default.
                **({"SERVESTACK_MODEL_DIR": model_dir} if model_dir else {}),
                "SERVESTACK_DEFAULT_MODEL": model_name,
                "SERVESTACK_PROVIDERS": "auto",
                **{f"SERVESTACK_BATCH_{k.upper()}": v for k, v in payload.items()},
            },
            logging=ecs.LogDriver.aws_logs(stream_prefix=name, log_group=logs),
        )
        for statement in statements:
            task.add_to_task_role_policy(statement)
        acknowledge(task, prefix_findings)
        acknowledge(
            task,
            {
                "AwsSolutions-ECS2": (
                    "The environment holds only non-secret settings (model name, bucket name, prefixes)."
                ),
                "AwsSolutions-IAM5[Resource::*]": (
                    "ecr:GetAuthorizationToken has no resource-level permissions (the execution role's image "
                    "pull is otherwise scoped to the asset repository)."
                ),
            },
        )
        self.task_definition = task
        security_group = ec2.SecurityGroup(
            self,
            "TaskSecurityGroup",
            vpc=vpc,
            allow_all_outbound=True,
            description=f"{name} batch task: egress only",
        )
        target = targets.EcsRunFargateTask(
            cluster,
            task_definition=task,
            assign_public_ip=True,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            security_groups=[security_group],
            dead_letter_queue=self.dead_letters,
            retry_attempts=retry_attempts,
            max_event_age=Duration.seconds(max_event_age_sec),
        )
        # RunTask succeeds whatever the task's exit code, so Scheduler never sees a failed run: ECS's task state
        # change event does. Its fields (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs_task_events.html):
        # `lastStatus` STOPPED, each container's `exitCode`, and `stopCode` TaskFailedToStart for a task that never
        # ran (its image could not be pulled, say), which has no exit code. The cluster is this deployment's own.
        self.task_failed = events.Rule(
            self,
            "TaskFailed",
            description=f"servestack {name}: a batch task of this deployment failed (non-zero exit, or no start)",
            event_pattern=events.EventPattern(
                source=["aws.ecs"],
                detail_type=["ECS Task State Change"],
                detail={
                    "clusterArn": [cluster.cluster_arn],
                    "lastStatus": ["STOPPED"],
                    "$or": [
                        {"containers": {"exitCode": [{"anything-but": 0}]}},
                        {"stopCode": ["TaskFailedToStart"]},
                    ],
                },
            ),
        )
        # The rule needs no target: the alarm counts its matches, `TriggeredRules` with its `RuleName`
        # (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-monitoring.html), which is the simplest
        # correct path: no function, queue or permission between the failure and the alarm. The task's own
        # output (its log group) says why it failed.
        failures = cw.Metric(
            namespace="AWS/Events",
            metric_name="TriggeredRules",
            dimensions_map={"RuleName": self.task_failed.rule_name},
            statistic="Sum",
            period=Duration.minutes(5),
        )
        return target, failures

    def _transform(
        self,
        name: str,
        bucket: s3.IBucket,
        image: ecr_assets.DockerImageAsset,
        model_data: s3_assets.Asset,
        code: lambda_.Code | FunctionCode,
        payload: dict[str, str],
        model_name: str,
        input_format: str,
        instance_type: str,
        instance_count: int,
        max_payload_mb: int,
        max_concurrent_transforms: int,
        timeout_sec: int,
        memory_mib: int,
        architecture: str,
        max_payload_bytes: int,
        log_retention_days: int,
        statements: tuple[iam.PolicyStatement, ...],
        prefix_findings: dict[str, str],
        retry_attempts: int,
        max_event_age_sec: int,
    ) -> tuple[scheduler.IScheduleTarget, cw.IMetric]:
        """The SageMaker model, the schedule's CreateTransformJob target, and the function that writes the
        manifest when a job of this deployment ends."""
        check_choice("BatchJob", "input_format", input_format, tuple(_TRANSFORM_CONTENT_TYPES))
        check_range("BatchJob", "instance_count", instance_count, 1, 100)
        check_range("BatchJob", "max_payload_mb", max_payload_mb, 1, 100)
        check_range("BatchJob", "max_concurrent_transforms", max_concurrent_transforms, 1, 64)
        check_range("BatchJob", "transform_timeout_sec", timeout_sec, 1, 3600)
        if len(name) > _JOB_NAME_MAX:
            raise ValueError(
                f"BatchJob: name={name!r} is longer than {_JOB_NAME_MAX} characters: with '-' and Scheduler's "
                "16-character execution id it must fit SageMaker's 63-character TransformJobName"
            )
        role = transform_role(
            self, bucket=bucket, image=image, model_data=model_data, output_prefix=self.output_prefix,
            statements=statements[:2], prefix_findings=prefix_findings,
        )  # fmt: skip
        self.transform_role = role
        model = servestack_model(
            self,
            "Model",
            role=role,
            image_uri=image.image_uri,
            model_data_url=model_data.s3_object_url,
            environment={
                **single_model_environment(model_name),
                # What /execution-parameters reports (servestack/adapters/transform.py): the job's own values.
                "SERVESTACK_TRANSFORM_MAX_CONCURRENT_TRANSFORMS": str(max_concurrent_transforms),
                "SERVESTACK_TRANSFORM_MAX_PAYLOAD_MB": str(max_payload_mb),
                **self.gpu_environment,
            },
        )
        self.model = model
        target = transform_target(
            self, name=name, bucket=bucket, model=model, role=role, input_prefix=self.input_prefix,
            output_prefix=self.output_prefix, content_type=_TRANSFORM_CONTENT_TYPES[input_format],
            instance_type=instance_type, instance_count=instance_count, max_payload_mb=max_payload_mb,
            max_concurrent_transforms=max_concurrent_transforms, timeout_sec=timeout_sec,
            dead_letters=self.dead_letters, retry_attempts=retry_attempts, max_event_age_sec=max_event_age_sec,
        )  # fmt: skip
        # The step after the job: the manifest and the error file, from the job's .out objects.
        self.function = servestack_function(
            self,
            "TransformDone",
            code=code,
            handler=TRANSFORM_DONE_HANDLER,
            environment=runtime_environment(model_name=model_name, max_payload_bytes=max_payload_bytes)
            | {f"SERVESTACK_BATCH_{k.upper()}": v for k, v in payload.items()}
            | {"SERVESTACK_BATCH_INPUT_FORMAT": input_format},
            memory_mib=memory_mib,
            timeout_sec=900,
            architecture=architecture,
            log_retention_days=log_retention_days,
            description=f"servestack {name}: the manifest of a finished transform job (servestack.adapters.batch)",
        )
        for statement in statements:
            self.function.add_to_role_policy(statement)
        assert self.function.role is not None
        acknowledge(self.function.role, prefix_findings)
        self.job_ended = events.Rule(
            self,
            "TransformJobEnded",
            description=f"servestack {name}: a transform job of this deployment ended",
            event_pattern=events.EventPattern(
                source=["aws.sagemaker"],
                detail_type=["SageMaker Transform Job State Change"],
                detail={
                    "TransformJobName": [{"prefix": f"{name}-"}],
                    "TransformJobStatus": ["Completed", "Failed", "Stopped"],
                },
            ),
            targets=[
                events_targets.LambdaFunction(
                    self.function,
                    dead_letter_queue=self.dead_letters,
                    retry_attempts=retry_attempts,
                    max_event_age=Duration.seconds(max_event_age_sec),
                )
            ],
        )
        failures: cw.IMetric = self.function.metric_errors(period=Duration.minutes(5), statistic="Sum")
        return target, failures
