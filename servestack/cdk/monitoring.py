"""Scheduled drift monitoring in AWS (serving.yaml's `monitor:`, docs/monitoring.md): a function that runs the
check of `servestack monitor` over the deployment's capture (servestack/monitor/scheduled.py), an EventBridge
Scheduler schedule in the deployment's own schedule group that invokes it, and an alarm on its drift flag.

The function's role may read the capture prefix (`s3:GetObject` under it, `s3:ListBucket` with `s3:prefix`
under it; a batch deployment's: its input and output prefixes, where its runs' objects are), put metric data
to the drift namespace alone (`cloudwatch:PutMetricData` has no resource-level permission, so a
`cloudwatch:namespace` condition narrows it) and write its own log group: nothing else. Its code carries the
model package and any explicit baseline file, so it reads no other object.

The drift alarm watches `DriftDetected` (1 when the last check found drift) and ignores missing data: the check
runs once per schedule, so between checks the alarm keeps the last verdict rather than going back to OK. Missing
data also follows from a check that did not run, or raised: the failure alarm says so, as a batch deployment's
does (servestack/cdk/batch.py). It adds the function's `Errors` (the check raised or timed out), the schedule
group's `TargetErrorCount` (Scheduler could not invoke it) and the visible messages of the schedule's dead-letter
queue (an invocation that failed every retry), so that a broken check never reads as "no drift".
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, TimeZone
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from servestack.cdk.bundling import FunctionCode, function_code
from servestack.cdk.schedule_failures import FAILURE_PERIOD, schedule_dead_letters, schedule_failure_alarm
from servestack.cdk.serverless import LAMBDA_MODEL_DIR, servestack_function
from servestack.cdk.shared import acknowledge, logical_id
from servestack.cdk.sources import MONITOR_RUNTIME, Member
from servestack.monitor.setting import (
    BASELINE_DIR,
    DRIFT_DETECTED,
    DRIFT_SCORE,
    HANDLER,
    NAMESPACE,
    SETTING_ENV,
    MonitorSetting,
)
from servestack.spec import Capture, ModelSpec, Monitor

# The alarm's period: one check's datapoint falls in it; missing data (between checks) is ignored.
ALARM_PERIOD = Duration.hours(1)
# Scheduler's retries of an invocation it could not make, and how long it keeps trying: a daily check's event is
# stale after an hour, and the dead-letter queue then says it was lost.
RETRY_ATTEMPTS = 2
MAX_EVENT_AGE = Duration.hours(1)
_PREFIX_REASON = (
    "The check reads the capture objects under the deployment's capture prefix (a batch deployment's: its runs' "
    "input and output objects); their names are only known at run time, so the prefix ends in a wildcard."
)


class DriftMonitor(Construct):
    """The scheduled check of one deployment: its function and role, schedule (in the deployment's own schedule
    group: `schedule_group` when the deployment already has one, a batch deployment's, else a new one), its
    dead-letter queue, the drift alarm and the failure alarm."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        name: str,
        setting: MonitorSetting,
        bucket: s3.IBucket,
        code: FunctionCode,
        schedule: str,
        timezone: str,
        architecture: str = "x86_64",
        log_retention_days: int = 30,
        memory_mib: int = 2048,
        timeout_sec: int = 900,
        schedule_group: scheduler.IScheduleGroup | None = None,
        read_prefixes: list[str] | None = None,
    ) -> None:
        super().__init__(scope, id)
        if not schedule.startswith(("cron(", "rate(")):
            raise ValueError(f"DriftMonitor: schedule={schedule!r} is not 'cron(...)' or 'rate(...)'")
        prefix = setting.prefix
        # What it reads: the capture prefix; a batch deployment's input and output prefixes
        prefixes = read_prefixes or [prefix]
        self.function = servestack_function(
            self,
            "Function",
            code=code,
            handler=HANDLER,
            # It serves no request: only where its packages are, and what to check.
            environment={"SERVESTACK_MODEL_DIR": LAMBDA_MODEL_DIR, SETTING_ENV: setting.to_json()},
            memory_mib=memory_mib,
            timeout_sec=timeout_sec,
            architecture=architecture,
            log_retention_days=log_retention_days,
            description=f"servestack {name}: scheduled drift check of s3://<bucket>/{prefix}",
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{p}*") for p in prefixes])
        )
        # Listing the input prefix too: a batch input gone since its run is then NoSuchKey, not AccessDenied.
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
            )
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": NAMESPACE}},
            )
        )
        assert self.function.role is not None
        acknowledge(
            self.function.role,
            {
                **{f"AwsSolutions-IAM5[Resource::<{logical_id(bucket)}.Arn>/{p}*]": _PREFIX_REASON for p in prefixes},
                "AwsSolutions-IAM5[Resource::*]": (
                    "cloudwatch:PutMetricData has no resource-level permissions; a condition limits it to the "
                    f"{NAMESPACE} namespace."
                ),
            },
        )
        scheduler_role = iam.Role(self, "SchedulerRole", assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"))
        acknowledge(
            scheduler_role,
            {
                f"AwsSolutions-IAM5[Resource::<{logical_id(self.function)}.Arn>:*]": (
                    "CDK's invoke grant also covers this one function's versions and aliases (`<arn>:*`); the role "
                    "can invoke nothing else."
                )
            },
        )
        # Invocations Scheduler could not make after its retries land here, sent by the scheduler's role (the
        # target's grant): the function's own role gets nothing on it.
        self.dead_letters = schedule_dead_letters(self, "check schedule")
        # The deployment's own group (as a batch deployment's schedule is in its own, which a batch deployment's
        # check shares): Scheduler's metrics have the group as their one dimension.
        self.schedule_group = schedule_group or scheduler.ScheduleGroup(
            self, "ScheduleGroup", schedule_group_name=name, removal_policy=RemovalPolicy.DESTROY
        )
        self.schedule = scheduler.Schedule(
            self,
            "Schedule",
            schedule_name=f"{name}-monitor",
            schedule_group=self.schedule_group,
            schedule=scheduler.ScheduleExpression.expression(schedule, TimeZone.of(timezone)),
            target=targets.LambdaInvoke(
                self.function,
                role=scheduler_role,
                dead_letter_queue=self.dead_letters,
                retry_attempts=RETRY_ATTEMPTS,
                max_event_age=MAX_EVENT_AGE,
            ),
            description=f"servestack {name}: drift check of its {'runs' if setting.source == 'batch' else 'capture'}",
        )
        # The schedule names its group by a plain string: without this, CloudFormation may create it first.
        self.schedule.node.add_dependency(self.schedule_group)
        self.alarm = cw.Alarm(
            self,
            "DriftAlarm",
            alarm_name=f"{name}-drift",
            alarm_description=(
                f"{name}: the last scheduled drift check found a column or prediction past its threshold "
                "(its log line names them)"
            ),
            metric=cw.Metric(
                namespace=NAMESPACE,
                metric_name=DRIFT_DETECTED,
                dimensions_map={"Deployment": setting.deployment},
                statistic="Maximum",
                period=ALARM_PERIOD,
            ),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.IGNORE,
        )
        # Every column's score, whichever columns the model has: a search over the deployment's DriftScore metrics.
        self.scores = cw.MathExpression(
            expression=(
                f'SEARCH(\'{{{NAMESPACE},Column,Deployment}} MetricName="{DRIFT_SCORE}" '
                f"Deployment=\"{setting.deployment}\"', 'Maximum', {int(ALARM_PERIOD.to_seconds())})"
            ),
            label="drift score by column",
            period=ALARM_PERIOD,
        )
        self.failure_alarm = schedule_failure_alarm(
            self,
            alarm_name=f"{name}-monitor-failures",
            description=(
                f"{name}: the scheduled drift check failed (it raised or timed out: its log says why), its schedule "
                "could not invoke it, or its invocation was dead-lettered; the drift alarm then has no new verdict"
            ),
            failures=self.function.metric_errors(period=FAILURE_PERIOD, statistic="Sum"),
            schedule_group=self.schedule_group,
            dead_letters=self.dead_letters,
            label="failed checks + target errors + dead letters",
        )
        self.alarms = [self.alarm, self.failure_alarm]


def add_drift_monitor(
    scope: Construct,
    *,
    name: str,
    deployment: str,
    monitor: Monitor,
    capture: Capture,
    model: ModelSpec,
    bucket: s3.IBucket,
    root: Path,
    entry_points: Path,
    architecture: str,
    log_retention_days: int,
    batch_prefixes: tuple[str, str] | None = None,
    schedule_group: scheduler.IScheduleGroup | None = None,
) -> DriftMonitor:
    """The `DriftMonitor` of a deployment's `monitor:` block: its code is servestack's runtime with the monitor,
    the deployment's model package and the explicit baseline file, if any. A batch deployment's check reads its
    runs: `batch_prefixes` (its input and output prefixes), in its own schedule group (`schedule_group`)."""
    extra: list[Member] = []
    if monitor.baseline is not None:
        extra.append((f"{BASELINE_DIR}/{Path(monitor.baseline).name}", root / monitor.baseline))
    code = function_code(
        entry_points=entry_points,
        artifacts=[model.artifact_path],
        artifacts_root=root,
        architecture=architecture,
        runtime=MONITOR_RUNTIME,
        extra=extra,
    )
    thresholds = {
        "psi": monitor.max_psi,
        "js": monitor.max_js,
        "unseen": monitor.max_unseen,
        "out_of_range": monitor.max_out_of_range,
        "missing": monitor.max_missing_increase,
    }
    setting = MonitorSetting(
        deployment=deployment,
        bucket=bucket.bucket_name,
        prefix=capture.prefix_of(deployment) if batch_prefixes is None else batch_prefixes[1],
        model=model.name,
        version=model.version,
        window_hours=monitor.window_hours,
        min_rows=monitor.min_rows,
        thresholds=thresholds,
        baseline=Path(monitor.baseline).name if monitor.baseline is not None else None,
        source="capture" if batch_prefixes is None else "batch",
    )
    return DriftMonitor(
        scope,
        "Monitor",
        name=name,
        setting=setting,
        bucket=bucket,
        code=code,
        schedule=monitor.schedule,
        timezone=monitor.timezone,
        architecture=architecture,
        log_retention_days=log_retention_days,
        schedule_group=schedule_group,
        read_prefixes=list(batch_prefixes) if batch_prefixes is not None else None,
    )
