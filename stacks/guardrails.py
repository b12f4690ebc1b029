"""Release guardrails: the one place that turns a deployment's `alarms` and `strategy` blocks into CloudWatch
alarms, CodeDeploy deployment configs (Lambda) and SageMaker blue/green deployment configs.

Each mode construct calls these functions in its own scope, so it creates the alarms that guard it.
Alarm names are fixed (`<prefix><deployment>-<what>`): SageMaker's auto-rollback refers to alarms by name,
and people find them by name in the console.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_codedeploy as codedeploy
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from servestack.spec import AlarmSettings, Strategy

SAGEMAKER_NAMESPACE = "AWS/SageMaker"
SAGEMAKER_INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"
# SageMaker's blue/green MaximumExecutionTimeoutInSeconds bounds.
_MAX_EXECUTION_SEC = (600, 28_800)
# Time allowed for the green fleet to be provisioned before the first traffic shift.
_PROVISIONING_ALLOWANCE_SEC = 1800


def _alarm(
    scope: Construct,
    id: str,
    *,
    name: str,
    metric: cw.IMetric,
    threshold: float,
    settings: AlarmSettings,
    description: str,
    comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
    periods: int | None = None,
) -> cw.Alarm:
    return cw.Alarm(
        scope,
        id,
        alarm_name=name,
        alarm_description=description,
        metric=metric,
        threshold=threshold,
        comparison_operator=comparison,
        evaluation_periods=periods or settings.evaluation_periods,
        datapoints_to_alarm=periods or settings.evaluation_periods,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )


def _rate_percent(errors: cw.IMetric, total: cw.IMetric, period: Duration, label: str) -> cw.MathExpression:
    return cw.MathExpression(
        expression="IF(total > 0, 100 * errors / total, 0)",
        using_metrics={"errors": errors, "total": total},
        period=period,
        label=label,
    )


# --- SageMaker endpoints --------------------------------------------------------------------------


def sagemaker_variant_metric(
    endpoint_name: str,
    variant: str,
    metric: str,
    statistic: str,
    period: Duration,
    namespace: str = SAGEMAKER_NAMESPACE,
) -> cw.Metric:
    return cw.Metric(
        namespace=namespace,
        metric_name=metric,
        dimensions_map={"EndpointName": endpoint_name, "VariantName": variant},
        statistic=statistic,
        period=period,
    )


def sagemaker_variant_alarms(
    scope: Construct, *, endpoint_name: str, variant: str, settings: AlarmSettings
) -> list[cw.Alarm]:
    """5xx rate (%) and p99 model latency of one production variant; the endpoint rolls back on either."""
    period = Duration.seconds(settings.period_sec)
    errors = sagemaker_variant_metric(endpoint_name, variant, "Invocation5XXErrors", "Sum", period)
    total = sagemaker_variant_metric(endpoint_name, variant, "Invocations", "Sum", period)
    # ModelLatency is published in microseconds.
    latency = sagemaker_variant_metric(endpoint_name, variant, "ModelLatency", "p99", period)
    return [
        _alarm(
            scope,
            f"{variant}5xxRate",
            name=f"{endpoint_name}-{variant}-5xx-rate",
            metric=_rate_percent(errors, total, period, "5xx %"),
            threshold=settings.error_rate_percent,
            settings=settings,
            description=f"{endpoint_name}/{variant}: 5xx rate above {settings.error_rate_percent}%",
        ),
        _alarm(
            scope,
            f"{variant}P99Latency",
            name=f"{endpoint_name}-{variant}-p99-latency",
            metric=latency,
            threshold=settings.p99_latency_ms * 1000,
            settings=settings,
            description=f"{endpoint_name}/{variant}: p99 ModelLatency above {settings.p99_latency_ms} ms",
        ),
    ]


def sagemaker_execution_timeout_sec(strategy: Strategy) -> int:
    """MaximumExecutionTimeoutInSeconds covering provisioning, every wait interval and the bake time."""
    needed = _PROVISIONING_ALLOWANCE_SEC + strategy.steps * strategy.interval_minutes * 60 + strategy.bake_minutes * 60
    lo, hi = _MAX_EXECUTION_SEC
    if needed > hi:
        raise ValueError(
            f"strategy: {strategy.steps} steps x {strategy.interval_minutes} min + "
            f"{strategy.bake_minutes} min bake needs {needed} s, which is not <= {hi} s (SageMaker's limit); "
            "use fewer or shorter steps"
        )
    return max(lo, needed)


def sagemaker_deployment_config(
    strategy: Strategy, alarms: list[cw.Alarm]
) -> sagemaker.CfnEndpoint.DeploymentConfigProperty:
    """Blue/green update policy from the spec's strategy, rolling back when any of `alarms` fires."""
    wait_sec = strategy.interval_minutes * 60
    routing: sagemaker.CfnEndpoint.TrafficRoutingConfigProperty
    if strategy.type == "canary":
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
            type="CANARY",
            canary_size=sagemaker.CfnEndpoint.CapacitySizeProperty(
                type="CAPACITY_PERCENT", value=strategy.canary_percent
            ),
            wait_interval_in_seconds=wait_sec,
        )
    elif strategy.type == "linear":
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
            type="LINEAR",
            linear_step_size=sagemaker.CfnEndpoint.CapacitySizeProperty(
                type="CAPACITY_PERCENT", value=strategy.linear_step_percent
            ),
            wait_interval_in_seconds=wait_sec,
        )
    else:
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(type="ALL_AT_ONCE", wait_interval_in_seconds=0)
    return sagemaker.CfnEndpoint.DeploymentConfigProperty(
        blue_green_update_policy=sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
            traffic_routing_configuration=routing,
            maximum_execution_timeout_in_seconds=sagemaker_execution_timeout_sec(strategy),
            termination_wait_in_seconds=strategy.bake_minutes * 60,
        ),
        auto_rollback_configuration=sagemaker.CfnEndpoint.AutoRollbackConfigProperty(
            alarms=[sagemaker.CfnEndpoint.AlarmProperty(alarm_name=a.alarm_name) for a in alarms]
        ),
    )


# --- Lambda -------------------------------------------------------------------------------------


def lambda_alarms(scope: Construct, *, name: str, alias: lambda_.IAlias, settings: AlarmSettings) -> list[cw.Alarm]:
    """Error rate (%), p99 duration and throttles of the `live` alias; CodeDeploy rolls back on any."""
    period = Duration.seconds(settings.period_sec)
    return [
        _alarm(
            scope,
            "ErrorRate",
            name=f"{name}-error-rate",
            metric=_rate_percent(
                alias.metric_errors(period=period, statistic="Sum"),
                alias.metric_invocations(period=period, statistic="Sum"),
                period,
                "errors %",
            ),
            threshold=settings.error_rate_percent,
            settings=settings,
            description=f"{name}: function error rate above {settings.error_rate_percent}%",
        ),
        _alarm(
            scope,
            "P99Duration",
            name=f"{name}-p99-duration",
            metric=alias.metric_duration(period=period, statistic="p99"),
            threshold=settings.p99_latency_ms,
            settings=settings,
            description=f"{name}: p99 duration above {settings.p99_latency_ms} ms",
        ),
        _alarm(
            scope,
            "Throttles",
            name=f"{name}-throttles",
            metric=alias.metric_throttles(period=period, statistic="Sum"),
            threshold=0,
            settings=settings,
            description=f"{name}: invocations throttled (raise reserved or provisioned concurrency)",
        ),
    ]


def lambda_deployment_config(scope: Construct, id: str, strategy: Strategy) -> codedeploy.ILambdaDeploymentConfig:
    """CodeDeploy config for the strategy: all at once, or time-based canary/linear with the spec's sizes."""
    interval = Duration.minutes(strategy.interval_minutes)
    if strategy.type == "canary":
        routing = codedeploy.TrafficRouting.time_based_canary(interval=interval, percentage=strategy.canary_percent)
    elif strategy.type == "linear":
        routing = codedeploy.TrafficRouting.time_based_linear(
            interval=interval, percentage=strategy.linear_step_percent
        )
    else:
        return codedeploy.LambdaDeploymentConfig.ALL_AT_ONCE
    return codedeploy.LambdaDeploymentConfig(scope, id, traffic_routing=routing)


def function_failure_alarm(scope: Construct, *, name: str, function: lambda_.IFunction) -> cw.Alarm:
    """Any failed invocation of a job-style function (batch run, async worker crash)."""
    return cw.Alarm(
        scope,
        "FailureAlarm",
        alarm_name=f"{name}-failures",
        alarm_description=f"{name}: a run failed; see the function's logs",
        metric=function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
        threshold=0,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluation_periods=1,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )


# --- queues -------------------------------------------------------------------------------------


def dead_letter_alarm(scope: Construct, *, name: str, dlq: sqs.IQueue) -> cw.Alarm:
    """Anything in the dead-letter queue is a request that failed every retry."""
    return cw.Alarm(
        scope,
        "DeadLetterAlarm",
        alarm_name=f"{name}-dead-letters",
        alarm_description=f"{name}: messages in the dead-letter queue; inspect and redrive them",
        metric=dlq.metric_approximate_number_of_messages_visible(period=Duration.minutes(1), statistic="Maximum"),
        threshold=0,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluation_periods=1,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )


def queue_age_alarm(scope: Construct, *, name: str, queue: sqs.IQueue, settings: AlarmSettings) -> cw.Alarm:
    """The oldest queued job has waited longer than the spec allows: workers are too few or failing."""
    return _alarm(
        scope,
        "OldestMessageAlarm",
        name=f"{name}-oldest-message-age",
        metric=queue.metric_approximate_age_of_oldest_message(
            period=Duration.seconds(settings.period_sec), statistic="Maximum"
        ),
        threshold=settings.oldest_message_age_sec,
        settings=settings,
        description=f"{name}: oldest queued job older than {settings.oldest_message_age_sec} s",
    )
