"""What a scheduled target's failures leave behind, shared by a batch deployment's schedule and the scheduled drift
check: the dead-letter queue its invocations land in after Scheduler's retries, and the alarm that adds up the
target's own failures, the schedule group's target errors and the dead letters."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from servestack.cdk.shared import acknowledge

FAILURE_PERIOD = Duration.minutes(5)


def schedule_dead_letters(scope: Construct, whose: str) -> sqs.Queue:
    """The encrypted, TLS-only dead-letter queue (`DeadLetters` in `scope`) of `whose` schedule's target."""
    queue = sqs.Queue(
        scope,
        "DeadLetters",
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.days(14),
    )
    acknowledge(queue, {"AwsSolutions-SQS3": f"This queue is the {whose}'s dead-letter queue; it has no DLQ."})
    return queue


def schedule_failure_alarm(
    scope: Construct,
    *,
    alarm_name: str,
    description: str,
    failures: cw.IMetric,
    schedule_group: scheduler.IScheduleGroup,
    dead_letters: sqs.IQueue,
    label: str,
) -> cw.Alarm:
    """`FailureAlarm` in `scope`: in ALARM when the target failed (`failures`), the schedule could not invoke it,
    or an invocation was dead-lettered, within five minutes."""
    return cw.Alarm(
        scope,
        "FailureAlarm",
        alarm_name=alarm_name,
        alarm_description=description,
        metric=cw.MathExpression(
            expression="FILL(failed, 0) + FILL(target_errors, 0) + FILL(dlq, 0)",
            using_metrics={
                "failed": failures,
                "target_errors": schedule_group.metric_target_errors(period=FAILURE_PERIOD, statistic="Sum"),
                "dlq": dead_letters.metric_approximate_number_of_messages_visible(
                    period=FAILURE_PERIOD, statistic="Maximum"
                ),
            },
            period=FAILURE_PERIOD,
            label=label,
        ),
        threshold=0,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluation_periods=1,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
