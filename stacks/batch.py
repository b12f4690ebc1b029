"""Batch mode: an EventBridge Scheduler schedule (cron or rate, with a time zone) that runs handlers/batch.py
over every object under the input prefix and writes predictions under the output prefix.

Short jobs run on Lambda (`handlers.batch.handler`); long ones on ECS Fargate with the same code in the CPU
container (`python -m handlers.batch`). The schedule's target has a retry policy and a dead-letter queue; a
failure alarm watches both the runs and the DLQ.

Handler contract: the scheduled payload is {"deployment", "bucket", "input_prefix", "output_prefix",
"model"}; on Fargate the same values arrive as SERVESTACK_BATCH_* environment variables.
"""

from __future__ import annotations

from aws_cdk import Duration, TimeZone
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.serverless import runtime_environment, servestack_function
from stacks.shared import acknowledge, check_choice, check_range, log_group, logical_id

HANDLER = "handlers.batch.handler"
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
        code: lambda_.Code | None = None,
        image: ecr_assets.DockerImageAsset | None = None,
        memory_mib: int = 2048,
        timeout_sec: int = 900,
        architecture: str = "x86_64",
        fargate_cpu: int = 1024,
        fargate_memory_mib: int = 4096,
        retry_attempts: int = 2,
        max_event_age_sec: int = 3600,
        max_payload_bytes: int = 6_291_456,
        log_retention_days: int = 30,
    ) -> None:
        super().__init__(scope, id)
        check_choice("BatchJob", "runner", runner, ("lambda", "fargate"))
        check_range("BatchJob", "retry_attempts", retry_attempts, 0, 185)
        check_range("BatchJob", "max_event_age_sec", max_event_age_sec, 60, 86_400)
        if not schedule.startswith(("cron(", "rate(")):
            raise ValueError(f"BatchJob: schedule={schedule!r} is not 'cron(...)' or 'rate(...)'")
        if runner == "lambda" and code is None:
            raise ValueError("BatchJob: runner='lambda' needs code, got None")
        if runner == "fargate" and image is None:
            raise ValueError("BatchJob: runner='fargate' needs image, got None")
        self.input_prefix = input_prefix or f"batch/{name}/input/"
        self.output_prefix = output_prefix or f"batch/{name}/output/"
        payload = {
            "deployment": name,
            "bucket": bucket.bucket_name,
            "input_prefix": self.input_prefix,
            "output_prefix": self.output_prefix,
            "model": model_name,
        }
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        acknowledge(
            self.dead_letters,
            {"AwsSolutions-SQS3": "This queue is the schedule target's dead-letter queue; it has no DLQ."},
        )
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
                description=f"servestack {name}: scheduled batch scoring (handlers.batch)",
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
        else:
            assert image is not None
            target, failures = self._fargate(
                name, image, payload, model_name, fargate_cpu, fargate_memory_mib, architecture,
                log_retention_days, (read_input, list_input, write_output, list_output), prefix_findings,
                retry_attempts, max_event_age_sec,
            )  # fmt: skip

        self.schedule = scheduler.Schedule(
            self,
            "Schedule",
            schedule=scheduler.ScheduleExpression.expression(schedule, TimeZone.of(timezone)),
            target=target,
            description=f"servestack {name}: batch scoring of s3://<bucket>/{self.input_prefix}",
        )
        self.alarm = cw.Alarm(
            self,
            "FailureAlarm",
            alarm_name=f"{name}-failures",
            alarm_description=f"{name}: a batch run failed or its invocation was dead-lettered",
            metric=cw.MathExpression(
                expression="FILL(failed, 0) + FILL(dlq, 0)",
                using_metrics={
                    "failed": failures,
                    "dlq": self.dead_letters.metric_approximate_number_of_messages_visible(
                        period=Duration.minutes(5), statistic="Maximum"
                    ),
                },
                period=Duration.minutes(5),
                label="failed runs + dead letters",
            ),
            threshold=0,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        self.alarms = [self.alarm]

    def _fargate(
        self,
        name: str,
        image: ecr_assets.DockerImageAsset,
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
        # Stopped tasks with a non-zero exit code show up as FAILED events; count invocation failures here.
        failures = cw.Metric(
            namespace="AWS/Scheduler",
            metric_name="TargetErrorCount",
            dimensions_map={"ScheduleGroup": "default"},
            statistic="Sum",
            period=Duration.minutes(5),
        )
        return target, failures
