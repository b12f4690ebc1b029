"""CloudWatch alarms, as `local up` plays them: those whose metrics local mode has (a rule it plays, metrics its
code publishes, the few of AWS's services it counts), created on the emulator and evaluated from the datapoints it
holds.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.cloudwatch.alarms import (
        AlarmDef,
        AlarmNotEvaluated,
        alarm_states,
        ensure_alarm,
        evaluate,
        evaluate_alarms,
    )
    from servestack.local.cloudwatch.planning import AlarmsPlanner
    from servestack.local.cloudwatch.reading import EVALUATED_ALARM, NOT_EVALUATED_ALARM, read_alarms
    from servestack.local.cloudwatch.service_metrics import ServiceCounter
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "EVALUATED_ALARM",
    "NOT_EVALUATED_ALARM",
    "AlarmDef",
    "AlarmNotEvaluated",
    "AlarmsPlanner",
    "ServiceCounter",
    "alarm_states",
    "ensure_alarm",
    "evaluate",
    "evaluate_alarms",
    "read_alarms",
]
