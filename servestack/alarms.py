"""The alarm definitions that guard a release, in one place: `servestack/cdk/guardrails.py` turns them into CloudWatch
alarms, and the local rehearsal (`servestack local deploy`) evaluates them on live local metrics.

A definition says what CloudWatch needs: the metric (or the ratio of two), the statistic, the threshold in
the metric's own unit, the period and how many periods must breach. `evaluate` applies CloudWatch's rule
to a series of datapoints: ALARM when `datapoints_to_alarm` of the last `evaluation_periods` breach, missing
data not breaching (`TreatMissingData: notBreaching`). This module must not import aws_cdk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # a type only: the router, which records observations, need not build serving.yaml's schema
    from servestack.spec import AlarmSettings

Statistic = Literal["Sum", "p99", "rate"]


@dataclass(frozen=True)
class AlarmDefinition:
    """One alarm. For `statistic == "rate"`, the value is 100 * Sum(metric) / Sum(denominator) in percent."""

    id: str  # construct id suffix, e.g. "5xxRate" (a public contract: renaming it replaces the alarm)
    name: str  # alarm name suffix, e.g. "5xx-rate"
    metric: str
    statistic: Statistic
    threshold: float
    unit: Literal["percent", "microseconds", "milliseconds", "count"]
    period_sec: int
    evaluation_periods: int
    datapoints_to_alarm: int
    description: str  # "{target}" is replaced with the endpoint/variant or function name
    denominator: str | None = None

    def breaches(self, value: float | None) -> bool:
        return value is not None and value > self.threshold

    def evaluate(self, datapoints: Sequence[float | None]) -> bool:
        """True (ALARM) when enough of the last `evaluation_periods` datapoints breach the threshold."""
        window = list(datapoints)[-self.evaluation_periods :]
        return sum(1 for value in window if self.breaches(value)) >= self.datapoints_to_alarm

    def with_period(self, period_sec: int, evaluation_periods: int | None = None) -> AlarmDefinition:
        """The same alarm on a shorter clock (rehearsals compress minutes into seconds)."""
        periods = evaluation_periods or self.evaluation_periods
        return replace(self, period_sec=period_sec, evaluation_periods=periods, datapoints_to_alarm=periods)

    def describe(self, target: str) -> str:
        return self.description.format(target=target)


def sagemaker_variant_alarms(settings: AlarmSettings) -> list[AlarmDefinition]:
    """5xx rate (%) and p99 ModelLatency (published in microseconds) of one production variant."""
    common: dict[str, Any] = {
        "period_sec": settings.period_sec,
        "evaluation_periods": settings.evaluation_periods,
        "datapoints_to_alarm": settings.evaluation_periods,
    }
    return [
        AlarmDefinition(
            id="5xxRate",
            name="5xx-rate",
            metric="Invocation5XXErrors",
            denominator="Invocations",
            statistic="rate",
            threshold=settings.error_rate_percent,
            unit="percent",
            description=f"{{target}}: 5xx rate above {settings.error_rate_percent}%",
            **common,
        ),
        AlarmDefinition(
            id="P99Latency",
            name="p99-latency",
            metric="ModelLatency",
            statistic="p99",
            threshold=settings.p99_latency_ms * 1000,
            unit="microseconds",
            description=f"{{target}}: p99 ModelLatency above {settings.p99_latency_ms} ms",
            **common,
        ),
    ]


# The realtime container's own overload metrics (servestack/adapters/metrics.py writes them as EMF).
OVERLOAD_NAMESPACE = "servestack"


def sagemaker_overload_alarm(settings: AlarmSettings) -> AlarmDefinition:
    """Sustained 429s: the variant's containers refused more than `overload_429_per_period` requests in each of
    `evaluation_periods` periods in a row. Not a rollback alarm: overload calls for capacity, not the old release."""
    return AlarmDefinition(
        id="Overload429",
        name="429s",
        metric="Rejected",
        statistic="Sum",
        threshold=settings.overload_429_per_period,
        unit="count",
        period_sec=settings.period_sec,
        evaluation_periods=settings.evaluation_periods,
        datapoints_to_alarm=settings.evaluation_periods,
        description=(
            f"{{target}}: more than {settings.overload_429_per_period} requests answered 429 (overloaded) in each of "
            f"{settings.evaluation_periods} periods of {settings.period_sec} s; add instances or capacity"
        ),
    )


def lambda_alarms(settings: AlarmSettings) -> list[AlarmDefinition]:
    """Error rate (%), p99 duration (ms) and throttles of a function alias."""
    common: dict[str, Any] = {
        "period_sec": settings.period_sec,
        "evaluation_periods": settings.evaluation_periods,
        "datapoints_to_alarm": settings.evaluation_periods,
    }
    return [
        AlarmDefinition(
            id="ErrorRate",
            name="error-rate",
            metric="Errors",
            denominator="Invocations",
            statistic="rate",
            threshold=settings.error_rate_percent,
            unit="percent",
            description=f"{{target}}: function error rate above {settings.error_rate_percent}%",
            **common,
        ),
        AlarmDefinition(
            id="P99Duration",
            name="p99-duration",
            metric="Duration",
            statistic="p99",
            threshold=settings.p99_latency_ms,
            unit="milliseconds",
            description=f"{{target}}: p99 duration above {settings.p99_latency_ms} ms",
            **common,
        ),
        AlarmDefinition(
            id="Throttles",
            name="throttles",
            metric="Throttles",
            statistic="Sum",
            threshold=0,
            unit="count",
            description="{target}: invocations throttled (raise reserved or provisioned concurrency)",
            **common,
        ),
    ]


@dataclass(frozen=True)
class Observation:
    """One request as a variant's metrics see it."""

    at: float  # seconds, any monotonic clock
    status: int
    latency_us: float


def datapoints(
    definition: AlarmDefinition, observations: Iterable[Observation], start: float, now: float
) -> list[float | None]:
    """The definition's statistic for each complete period from `start` to `now` (None: no data)."""
    periods = int((now - start) // definition.period_sec)
    buckets: list[list[Observation]] = [[] for _ in range(max(periods, 0))]
    for item in observations:
        index = int((item.at - start) // definition.period_sec)
        if 0 <= index < periods:
            buckets[index].append(item)
    return [_statistic(definition, bucket) for bucket in buckets]


def _statistic(definition: AlarmDefinition, bucket: list[Observation]) -> float | None:
    if not bucket:
        return None
    if definition.statistic == "rate":
        return 100 * sum(1 for item in bucket if item.status >= 500) / len(bucket)
    if definition.statistic == "p99":
        ordered = sorted(item.latency_us for item in bucket)
        value = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        return value / 1000 if definition.unit == "milliseconds" else value
    return float(sum(1 for item in bucket if item.status == 429))  # Sum of throttles
