"""CloudWatch alarms of the templates that local mode evaluates: those whose every metric local mode has datapoints
of. They are the `TriggeredRules` metric of an EventBridge rule local mode plays (servestack/local/events/), as a
batch deployment's failure alarm watches the rule on its Fargate cluster's failed tasks; the metrics servestack's
own code puts to the emulator's CloudWatch with its role (`PUBLISHED_NAMESPACES`: the scheduled drift check's,
servestack/monitor/scheduled.py); and the few metrics of AWS's services that local mode counts where it plays
the service (`SERVICE_DIMENSION`, servestack/local/cloudwatch/service_metrics.py: a function's Errors, a schedule
group's target errors, a queue's visible messages), as the drift check's failure alarm and a batch deployment's
watch them.

Each is created on the emulator as CloudFormation creates it (PutMetricAlarm, with its metrics and math), so
that `DescribeAlarms` answers it, and is evaluated as CloudWatch evaluates it
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html): each metric's
statistic over the alarm's last period from the datapoints the emulator holds, the alarm's math over them
(`FILL(m, v)` standing for a metric without a datapoint), compared with the threshold; with no value at all,
its `TreatMissingData` (`ignore`: the state stays as it is). CloudWatch evaluates every period; local mode
evaluates when a rule it plays matches an event, and when `local status` reads the state, so an alarm goes back
to OK once a period passes without a breach. The state is set on the emulator (SetAlarmState) only when it
changes, so its `StateUpdatedTimestamp` says since when.

What local mode does not evaluate, it refuses here rather than guesses: a math expression other than a sum of
metrics and `FILL`s, a percentile statistic, an anomaly band. Such an alarm stays reported (`--explain`).
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from servestack.local.cloudwatch.service_metrics import QUEUE_DEPTH, SERVICE_DIMENSION, sample_queue_depths
from servestack.monitor.setting import NAMESPACE as DRIFT_NAMESPACE

EVENTS_NAMESPACE = "AWS/Events"
TRIGGERED_RULES = "TriggeredRules"
# Namespaces whose datapoints come from servestack's own code running locally, put to the emulator's CloudWatch as
# its role (IAM enforced), and who puts them.
PUBLISHED_NAMESPACES = {DRIFT_NAMESPACE: "the scheduled drift check (monitor:)"}
_STATISTICS = ("Sum", "Maximum", "Minimum", "Average", "SampleCount")
_COMPARISONS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "GreaterThanThreshold": (operator.gt, "greater than"),
    "GreaterThanOrEqualToThreshold": (operator.ge, "greater than or equal to"),
    "LessThanThreshold": (operator.lt, "less than"),
    "LessThanOrEqualToThreshold": (operator.le, "less than or equal to"),
}
_TERM = re.compile(r"\s*(?:FILL\(\s*([a-z]\w*)\s*,\s*(-?\d+(?:\.\d+)?)\s*\)|([a-z]\w*))\s*")


class AlarmNotEvaluated(ValueError):
    """An alarm whose definition local mode does not evaluate; the message says what."""


@dataclass(frozen=True)
class MetricOfAlarm:
    id: str
    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    statistic: str
    period_sec: int


@dataclass(frozen=True)
class AlarmDef:
    name: str
    metrics: tuple[MetricOfAlarm, ...]
    expression: str  # a sum of metric ids and `FILL(id, value)` terms; one metric's alarm: its id
    comparison: str
    threshold: float
    evaluation_periods: int
    treat_missing_data: str = "missing"
    description: str = ""

    @property
    def period_sec(self) -> int:
        return max(metric.period_sec for metric in self.metrics)

    def watched_rules(self) -> set[str]:
        """The names of the EventBridge rules whose TriggeredRules this alarm watches."""
        return {
            value
            for metric in self.metrics
            if (metric.namespace, metric.name) == (EVENTS_NAMESPACE, TRIGGERED_RULES)
            for key, value in metric.dimensions
            if key == "RuleName"
        }

    def evaluated_locally(self, played_rules: set[str]) -> bool:
        """Whether local mode has this alarm's datapoints: each of its metrics is the TriggeredRules of a rule it
        plays (`played_rules`, by name), one servestack's code publishes locally, or a service's it counts."""
        return all(_produced_locally(metric, played_rules) for metric in self.metrics)

    def watched_queues(self) -> set[str]:
        """The names of the queues whose visible messages this alarm watches (sampled when it is evaluated)."""
        return {
            value
            for metric in self.metrics
            if (metric.namespace, metric.name) == QUEUE_DEPTH
            for key, value in metric.dimensions
            if key == "QueueName"
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AlarmDef:
        metrics = tuple(
            MetricOfAlarm(**{**m, "dimensions": tuple(tuple(pair) for pair in m["dimensions"])})
            for m in data["metrics"]
        )
        return cls(**{**data, "metrics": metrics})


def _produced_locally(metric: MetricOfAlarm, played_rules: set[str]) -> bool:
    if (metric.namespace, metric.name) == (EVENTS_NAMESPACE, TRIGGERED_RULES):
        return any(key == "RuleName" and value in played_rules for key, value in metric.dimensions)
    dimension = SERVICE_DIMENSION.get((metric.namespace, metric.name))
    counted = dimension is not None and [key for key, _ in metric.dimensions] == [dimension]
    return metric.namespace in PUBLISHED_NAMESPACES or counted


def alarm_of(properties: Mapping[str, Any]) -> AlarmDef:
    """An `AWS::CloudWatch::Alarm`'s resolved properties as local mode evaluates them; AlarmNotEvaluated when it
    cannot be."""
    name = str(properties["AlarmName"])
    comparison = str(properties["ComparisonOperator"])
    if comparison not in _COMPARISONS:
        raise AlarmNotEvaluated(f"{name}: ComparisonOperator {comparison} (an anomaly band) is not evaluated locally")
    if "Metrics" in properties:
        expressions = [q for q in properties["Metrics"] if "Expression" in q]
        stats = [q for q in properties["Metrics"] if "MetricStat" in q]
        if len(expressions) > 1:
            raise AlarmNotEvaluated(f"{name}: more than one math expression is not evaluated locally")
        metrics = tuple(_metric(name, q["Id"], q["MetricStat"]["Metric"], q["MetricStat"]["Stat"],
                                q["MetricStat"]["Period"]) for q in stats)  # fmt: skip
        expression = expressions[0]["Expression"] if expressions else metrics[0].id
    else:
        metric = {k: properties.get(k) for k in ("Namespace", "MetricName", "Dimensions")}
        statistic = properties.get("Statistic") or properties.get("ExtendedStatistic") or ""
        metrics = (_metric(name, "m", metric, statistic, properties.get("Period", 60)),)
        expression = "m"
    _terms(name, expression, {m.id for m in metrics})
    return AlarmDef(
        name=name,
        metrics=metrics,
        expression=str(expression),
        comparison=comparison,
        threshold=float(properties["Threshold"]),
        evaluation_periods=int(properties.get("EvaluationPeriods", 1)),
        treat_missing_data=str(properties.get("TreatMissingData") or "missing"),
        description=str(properties.get("AlarmDescription") or ""),
    )


def _metric(alarm: str, id_: str, metric: Mapping[str, Any], statistic: str, period: Any) -> MetricOfAlarm:
    if statistic not in _STATISTICS:
        raise AlarmNotEvaluated(f"{alarm}: statistic {statistic!r} of {id_} is not evaluated locally")
    dimensions = tuple((str(d["Name"]), str(d["Value"])) for d in metric.get("Dimensions") or [])
    return MetricOfAlarm(id_, str(metric["Namespace"]), str(metric["MetricName"]), dimensions, statistic, int(period))


def _terms(alarm: str, expression: str, ids: set[str]) -> list[tuple[str, float | None]]:
    """The expression's terms, (metric id, FILL value or None); AlarmNotEvaluated for any other math."""
    terms: list[tuple[str, float | None]] = []
    for part in expression.split("+"):
        found = _TERM.fullmatch(part)
        if found is None:
            raise AlarmNotEvaluated(f"{alarm}: math {expression!r} is not a sum of metrics and FILLs")
        filled, value, plain = found.groups()
        metric = filled or plain
        if metric not in ids:
            raise AlarmNotEvaluated(f"{alarm}: math {expression!r} names {metric}, not one of its metrics")
        terms.append((metric, float(value) if filled else None))
    return terms


# ------------------------------------------------------------------------------------------ on the emulator


def ensure_alarm(cloudwatch: Any, alarm: AlarmDef) -> None:
    """PutMetricAlarm of the alarm as the template declares it (idempotent, as a stack update is); a new one starts
    INSUFFICIENT_DATA, as in CloudWatch (the emulator starts it OK, which an alarm ignoring missing data would
    keep before any datapoint)."""
    existed = cloudwatch.describe_alarms(AlarmNames=[alarm.name])["MetricAlarms"]
    queries: list[dict[str, Any]] = [
        {"Id": m.id, "ReturnData": False, "MetricStat": {
            "Metric": {"Namespace": m.namespace, "MetricName": m.name,
                       "Dimensions": [{"Name": k, "Value": v} for k, v in m.dimensions]},
            "Period": m.period_sec, "Stat": m.statistic,
        }}
        for m in alarm.metrics
    ]  # fmt: skip
    queries.append({"Id": "expression", "Expression": alarm.expression, "ReturnData": True})
    cloudwatch.put_metric_alarm(
        AlarmName=alarm.name, AlarmDescription=alarm.description, ComparisonOperator=alarm.comparison,
        Threshold=alarm.threshold, EvaluationPeriods=alarm.evaluation_periods,
        TreatMissingData=alarm.treat_missing_data, Metrics=queries,
    )  # fmt: skip
    if not existed:
        cloudwatch.set_alarm_state(
            AlarmName=alarm.name, StateValue="INSUFFICIENT_DATA", StateReason="Unchecked: Initial alarm creation"
        )


def evaluate(
    cloudwatch: Any, alarm: AlarmDef, now: datetime | None = None, current: str = "INSUFFICIENT_DATA"
) -> tuple[str, str]:
    """(state, reason) of the alarm now, from the datapoints the emulator holds over its last period; `current`,
    its state so far, is what `TreatMissingData: ignore` keeps."""
    now = now or datetime.now(UTC)
    values = {metric.id: _statistic(cloudwatch, metric, now) for metric in alarm.metrics}
    total: float | None = 0.0
    for metric, filled in _terms(alarm.name, alarm.expression, set(values)):
        value = values[metric] if values[metric] is not None else filled
        total = None if value is None or total is None else total + value
    if total is None:
        missing = {"breaching": "ALARM", "notBreaching": "OK", "ignore": current}
        state = missing.get(alarm.treat_missing_data, "INSUFFICIENT_DATA")
        return state, f"no datapoint in the last {alarm.period_sec} s (TreatMissingData: {alarm.treat_missing_data})"
    breached, words = _COMPARISONS[alarm.comparison]
    when = now.strftime("%d/%m/%y %H:%M:%S")
    # CloudWatch's own wording of a state change's reason
    reason = (
        f"Threshold Crossed: 1 datapoint [{total} ({when})] was {'' if breached(total, alarm.threshold) else 'not '}"
        f"{words} the threshold ({alarm.threshold})."
    )
    return ("ALARM" if breached(total, alarm.threshold) else "OK"), reason


def _statistic(cloudwatch: Any, metric: MetricOfAlarm, now: datetime) -> float | None:
    answer = cloudwatch.get_metric_statistics(
        Namespace=metric.namespace, MetricName=metric.name,
        Dimensions=[{"Name": k, "Value": v} for k, v in metric.dimensions],
        StartTime=now - timedelta(seconds=metric.period_sec), EndTime=now + timedelta(seconds=1),
        Period=metric.period_sec, Statistics=[metric.statistic],
    )  # fmt: skip
    points = [float(p[metric.statistic]) for p in answer.get("Datapoints", [])]
    if not points:
        return None
    if metric.statistic in ("Sum", "SampleCount"):
        return sum(points)
    if metric.statistic == "Maximum":
        return max(points)
    if metric.statistic == "Minimum":
        return min(points)
    return sum(points) / len(points)


def evaluate_alarms(
    cloudwatch: Any, alarms: Iterable[AlarmDef], now: datetime | None = None, *, sqs: Any | None = None
) -> dict[str, str]:
    """Evaluate each alarm and set its state on the emulator where it changed; each alarm's state by name. With
    `sqs` (the developer's client), the depth of each queue an alarm watches is sampled first."""
    alarms = list(alarms)
    if not alarms:
        return {}
    if sqs is not None:
        sample_queue_depths(cloudwatch, sqs, {queue for alarm in alarms for queue in alarm.watched_queues()})
    current = {
        a["AlarmName"]: a["StateValue"]
        for a in cloudwatch.describe_alarms(AlarmNames=[a.name for a in alarms])["MetricAlarms"]
    }
    states: dict[str, str] = {}
    for alarm in alarms:
        state, reason = evaluate(cloudwatch, alarm, now, current.get(alarm.name, "INSUFFICIENT_DATA"))
        if current.get(alarm.name) != state:
            cloudwatch.set_alarm_state(AlarmName=alarm.name, StateValue=state, StateReason=reason[:1023])
        states[alarm.name] = state
    return states


def alarm_states(cloudwatch: Any, names: Sequence[str]) -> list[dict[str, Any]]:
    """DescribeAlarms of the named alarms: name, state, its reason and since when."""
    if not names:
        return []
    found = cloudwatch.describe_alarms(AlarmNames=list(names))["MetricAlarms"]
    return [
        {"name": a["AlarmName"], "state": a["StateValue"], "reason": a.get("StateReason", ""),
         "since": a["StateUpdatedTimestamp"].isoformat() if a.get("StateUpdatedTimestamp") else None}
        for a in found
    ]  # fmt: skip
