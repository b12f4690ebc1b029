"""EventBridge's part of `local up`'s plan: the rules local mode plays of a stack, in the deployment's entry of the
state file, where whatever emits an event (the scheduler's task runner in local up, `local run-batch`) finds them."""

from __future__ import annotations

from typing import Protocol

from servestack.local.events.rules import RuleDef
from servestack.local.planning import PlanContext, ServicePlan


class RuleStack(Protocol):
    """What EventBridge reads of a stack's topology."""

    @property
    def rules(self) -> list[RuleDef]: ...


class EventsPlanner:
    name = "events"

    def plan(self, topology: RuleStack, context: PlanContext) -> ServicePlan:
        part = ServicePlan()
        if topology.rules:
            part.entry["rules"] = [rule.to_dict() for rule in topology.rules]
        return part
