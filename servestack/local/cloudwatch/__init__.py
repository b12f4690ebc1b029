"""CloudWatch alarms, as `local up` plays them: those that watch a rule local mode plays, created on the emulator
and evaluated from the datapoints it holds.

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
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "EVALUATED_ALARM",
    "NOT_EVALUATED_ALARM",
    "AlarmDef",
    "AlarmNotEvaluated",
    "AlarmsPlanner",
    "alarm_states",
    "ensure_alarm",
    "evaluate",
    "evaluate_alarms",
    "read_alarms",
]
