"""EventBridge's resource type of a template: each rule local mode plays, its event pattern checked once here.

A rule is played when its pattern is on the events local mode's services emit: an ECS task's state change
(`aws.ecs`, a Fargate batch task's stop). The SageMaker transform job state change rule is not played as a rule:
the emulated job sends its event to the rule's target function itself (servestack/local/sagemaker/transform.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servestack.local.cloudformation import Resolver, Resource
from servestack.local.events.patterns import PatternError, check

# The event sources local mode emits events of, and who emits them.
PLAYED_SOURCES = {"aws.ecs": "an ECS task's stop (a Fargate batch task run by its schedule or `local run-batch`)"}


@dataclass(frozen=True)
class RuleDef:
    logical_id: str
    name: str
    pattern: dict[str, Any]
    enabled: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuleDef:
        return cls(**data)


def pattern_of(resolver: Resolver, properties: Mapping[str, Any]) -> dict[str, Any] | None:
    """A rule's event pattern, resolved (CloudFormation takes an object or its JSON text); None for a scheduled
    rule."""
    pattern = resolver.resolve(properties.get("EventPattern"))
    if isinstance(pattern, str):
        pattern = json.loads(pattern)
    return pattern if isinstance(pattern, dict) else None


def played(pattern: Mapping[str, Any] | None) -> str | None:
    """Why local mode plays a rule of this pattern (the events it emits that it may match), or None."""
    sources = (pattern or {}).get("source")
    if not isinstance(sources, list):
        return None
    return next((PLAYED_SOURCES[s] for s in sources if isinstance(s, str) and s in PLAYED_SOURCES), None)


def read_rules(resolver: Resolver, resources: Sequence[Resource]) -> tuple[list[RuleDef], dict[str, str]]:
    """The rules local mode plays, and why each rule on a played source is not (its pattern, by logical id)."""
    rules: list[RuleDef] = []
    refused: dict[str, str] = {}
    for res in resources:
        if res.type != "AWS::Events::Rule":
            continue
        pattern = pattern_of(resolver, res.properties)
        if played(pattern) is None or pattern is None:
            continue
        try:
            check(pattern)
        except PatternError as why:
            refused[res.logical_id] = f"its pattern is not matched locally: {why}"
            continue
        enabled = str(resolver.resolve(res.properties.get("State", "ENABLED"))) == "ENABLED"
        rules.append(RuleDef(res.logical_id, resolver.physical_name(res.logical_id), pattern, enabled))
    return rules, refused


# How local mode plays a rule (`local up --explain`), by whether its pattern is on an event local mode emits.
PLAYED_RULE = (
    "emulated: its event pattern matched against {events}; a match counts one in the rule's TriggeredRules metric "
    "(AWS/Events, RuleName) on the emulator, and the alarms that watch it are evaluated (its targets, if any, are "
    "not invoked)"
)
NOT_PLAYED_RULE = (
    "not emulated as a rule: the emulated transform job (`servestack local run-batch`, or its schedule) sends "
    "the SageMaker transform job state change event to the rule's target function when it ends"
)
