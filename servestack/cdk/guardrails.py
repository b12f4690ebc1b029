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

from servestack import alarms as definitions
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


def _from_definition(
    scope: Construct,
    id: str,
    name_prefix: str,
    target: str,
    definition: definitions.AlarmDefinition,
    metric: cw.IMetric,
) -> cw.Alarm:
    return cw.Alarm(
        scope,
        id,
        alarm_name=f"{name_prefix}-{definition.name}",
        alarm_description=definition.describe(target),
        metric=metric,
        threshold=definition.threshold,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluation_periods=definition.evaluation_periods,
        datapoints_to_alarm=definition.datapoints_to_alarm,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
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
    """5xx rate (%) and p99 model latency of one production variant; the endpoint rolls back on either.
    The definitions (metric, statistic, threshold, periods) come from `servestack.alarms`, which the local
    rehearsal evaluates too."""
    alarms: list[cw.Alarm] = []
    target = f"{endpoint_name}/{variant}"
    for definition in definitions.sagemaker_variant_alarms(settings):
        period = Duration.seconds(definition.period_sec)
        metric: cw.IMetric = sagemaker_variant_metric(
            endpoint_name,
            variant,
            definition.metric,
            "Sum" if definition.statistic == "rate" else definition.statistic,
            period,
        )
        if definition.denominator is not None:
            total = sagemaker_variant_metric(endpoint_name, variant, definition.denominator, "Sum", period)
            metric = _rate_percent(metric, total, period, "5xx %")
        alarms.append(
            _from_definition(
                scope, f"{variant}{definition.id}", f"{endpoint_name}-{variant}", target, definition, metric
            )
        )
    return alarms


def sagemaker_overload_alarm(
    scope: Construct, *, endpoint_name: str, variant: str, settings: AlarmSettings
) -> cw.Alarm:
    """Sustained 429s of one variant, from the containers' EMF metrics (namespace `servestack`,
    servestack/adapters/metrics.py)."""
    definition = definitions.sagemaker_overload_alarm(settings)
    metric = sagemaker_variant_metric(
        endpoint_name,
        variant,
        definition.metric,
        "Sum",
        Duration.seconds(definition.period_sec),
        definitions.OVERLOAD_NAMESPACE,
    )
    target = f"{endpoint_name}/{variant}"
    return _from_definition(
        scope, f"{variant}{definition.id}", f"{endpoint_name}-{variant}", target, definition, metric
    )


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


# --- SageMaker inference components ---------------------------------------------------------------
# An inference component's invocation metrics are in AWS/SageMaker (SageMaker developer guide, "enhanced
# metrics for inference endpoints"), by the dimension InferenceComponentName (the guide's "Scale an endpoint to
# zero instances" alarms on NoCapacityInvocationFailures with it).
# A rolling update's batch is 5% to 50% of the component's copies (API reference,
# InferenceComponentRollingUpdatePolicy.MaximumBatchSize); its wait interval is 0..3600 s.
_COMPONENT_BATCH_PERCENT = (5, 50)


def sagemaker_component_metric(component: str, metric: str, statistic: str, period: Duration) -> cw.Metric:
    return cw.Metric(
        namespace=SAGEMAKER_NAMESPACE,
        metric_name=metric,
        dimensions_map={"InferenceComponentName": component},
        statistic=statistic,
        period=period,
    )


def sagemaker_component_alarms(
    scope: Construct, id_prefix: str, *, component: str, settings: AlarmSettings
) -> list[cw.Alarm]:
    """5xx rate (%) and p99 model latency of one inference component, from the same definitions as a variant's
    (`servestack.alarms`); a rolling update of the component rolls back on either."""
    alarms: list[cw.Alarm] = []
    for definition in definitions.sagemaker_variant_alarms(settings):
        period = Duration.seconds(definition.period_sec)
        statistic = "Sum" if definition.statistic == "rate" else definition.statistic
        metric: cw.IMetric = sagemaker_component_metric(component, definition.metric, statistic, period)
        if definition.denominator is not None:
            total = sagemaker_component_metric(component, definition.denominator, "Sum", period)
            metric = _rate_percent(metric, total, period, "5xx %")
        alarms.append(_from_definition(scope, f"{id_prefix}{definition.id}", component, component, definition, metric))
    return alarms


def sagemaker_component_deployment_config(
    strategy: Strategy, alarms: list[cw.Alarm]
) -> sagemaker.CfnInferenceComponent.InferenceComponentDeploymentConfigProperty:
    """A rolling update of one component in batches of the strategy's step (canary percent, linear step, or the
    largest batch SageMaker allows for all at once), baking each batch for the interval, rolling back (all at
    once) when any of `alarms` fires."""
    lo, hi = _COMPONENT_BATCH_PERCENT
    step = {"canary": strategy.canary_percent, "linear": strategy.linear_step_percent}.get(strategy.type, hi)
    batch = max(lo, min(hi, step))
    batches = -(-100 // batch)
    wait_sec = strategy.interval_minutes * 60 if strategy.type != "all_at_once" else 0
    needed = _PROVISIONING_ALLOWANCE_SEC + batches * wait_sec + strategy.bake_minutes * 60
    timeout_lo, timeout_hi = _MAX_EXECUTION_SEC
    return sagemaker.CfnInferenceComponent.InferenceComponentDeploymentConfigProperty(
        rolling_update_policy=sagemaker.CfnInferenceComponent.InferenceComponentRollingUpdatePolicyProperty(
            maximum_batch_size=sagemaker.CfnInferenceComponent.InferenceComponentCapacitySizeProperty(
                type="CAPACITY_PERCENT", value=batch
            ),
            wait_interval_in_seconds=wait_sec,
            maximum_execution_timeout_in_seconds=max(timeout_lo, min(timeout_hi, needed)),
            rollback_maximum_batch_size=sagemaker.CfnInferenceComponent.InferenceComponentCapacitySizeProperty(
                type="CAPACITY_PERCENT", value=100
            ),
        ),
        auto_rollback_configuration=sagemaker.CfnInferenceComponent.AutoRollbackConfigurationProperty(
            alarms=[sagemaker.CfnInferenceComponent.AlarmProperty(alarm_name=a.alarm_name) for a in alarms]
        ),
    )


# --- Lambda -------------------------------------------------------------------------------------


def lambda_alarms(scope: Construct, *, name: str, alias: lambda_.IAlias, settings: AlarmSettings) -> list[cw.Alarm]:
    """Error rate (%), p99 duration and throttles of the `live` alias; CodeDeploy rolls back on any."""
    alarms: list[cw.Alarm] = []
    for definition in definitions.lambda_alarms(settings):
        period = Duration.seconds(definition.period_sec)
        statistic = "Sum" if definition.statistic == "rate" else definition.statistic
        metric: cw.IMetric = alias.metric(definition.metric, period=period, statistic=statistic)
        if definition.denominator is not None:
            total = alias.metric(definition.denominator, period=period, statistic="Sum")
            metric = _rate_percent(metric, total, period, "errors %")
        alarms.append(_from_definition(scope, definition.id, name, name, definition, metric))
    return alarms


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
