"""EventBridge, as `local up` plays it: the templates' rules whose patterns are on the events local mode's services
emit (an ECS task's stop), each event matched against every rule as the default event bus does, a match counted in
the rule's TriggeredRules metric and the alarms on it evaluated.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.events.delivery import deliver, rules_and_alarms, task_stopped_event
    from servestack.local.events.patterns import PatternError, matches
    from servestack.local.events.planning import EventsPlanner
    from servestack.local.events.rules import NOT_PLAYED_RULE, PLAYED_RULE, RuleDef, pattern_of, played, read_rules
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "NOT_PLAYED_RULE",
    "PLAYED_RULE",
    "EventsPlanner",
    "PatternError",
    "RuleDef",
    "deliver",
    "matches",
    "pattern_of",
    "played",
    "read_rules",
    "rules_and_alarms",
    "task_stopped_event",
]
