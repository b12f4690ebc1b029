"""CloudWatch's resource types of a template: each alarm, as local mode evaluates it (or why it does not)."""

from __future__ import annotations

from collections.abc import Sequence

from servestack.local.cloudformation import Resolver, Resource
from servestack.local.cloudwatch.alarms import AlarmDef, AlarmNotEvaluated, alarm_of


def read_alarms(resolver: Resolver, resources: Sequence[Resource]) -> tuple[list[AlarmDef], dict[str, str]]:
    """The alarms local mode can evaluate, and why each other one is not (by logical id)."""
    alarms: list[AlarmDef] = []
    not_evaluated: dict[str, str] = {}
    for res in resources:
        if res.type != "AWS::CloudWatch::Alarm":
            continue
        properties = dict(resolver.resolve(res.properties))
        properties.setdefault("AlarmName", resolver.physical_name(res.logical_id))
        try:
            alarms.append(alarm_of(properties))
        except (AlarmNotEvaluated, KeyError, TypeError, ValueError) as why:
            not_evaluated[res.logical_id] = str(why)
    return alarms, not_evaluated


# How local mode plays an alarm whose every metric it has datapoints of (`local up --explain`): a rule it plays,
# metrics its code publishes, a service's metric it counts (servestack/local/cloudwatch/service_metrics.py); any
# other alarm is reported.
EVALUATED_ALARM = (
    "evaluated: created on the emulator (DescribeAlarms answers it), its state set from the datapoints the emulator "
    "holds when a rule it watches matches an event, and when `servestack local status` reads it (a queue it "
    "watches sampled then)"
)
NOT_EVALUATED_ALARM = "not evaluated (the `local deploy` rehearsal evaluates the rollback alarms)"
