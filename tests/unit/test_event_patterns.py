"""EventBridge event patterns as local mode matches them (servestack/local/events/patterns.py), on the pattern of a
Fargate batch deployment's failed-task rule (servestack/cdk/batch.py) and ECS's task state change events."""

from __future__ import annotations

from typing import Any

import pytest

from servestack.local.events import PatternError, matches, task_stopped_event
from servestack.local.events.patterns import check

CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/servestack-weekly-BatchCluster"
# The rule servestack/cdk/batch.py gives a Fargate deployment, resolved.
FAILED_TASK: dict[str, Any] = {
    "source": ["aws.ecs"],
    "detail-type": ["ECS Task State Change"],
    "detail": {
        "clusterArn": [CLUSTER],
        "lastStatus": ["STOPPED"],
        "$or": [{"containers": {"exitCode": [{"anything-but": 0}]}}, {"stopCode": ["TaskFailedToStart"]}],
    },
}


def stopped(exit_code: int | None, cluster: str = CLUSTER) -> dict[str, Any]:
    return task_stopped_event(
        region="us-east-1", account="123456789012", cluster_arn=cluster,
        task_arn=f"{cluster.replace(':cluster/', ':task/')}/abc", container="batch", exit_code=exit_code,
        task_definition_arn="arn:aws:ecs:us-east-1:123456789012:task-definition/weekly:1",
    )  # fmt: skip


@pytest.mark.parametrize(("exit_code", "matched"), [(66, True), (1, True), (137, True), (None, True), (0, False)])
def test_the_failed_task_rule_matches_a_non_zero_exit_or_a_task_that_never_started(
    exit_code: int | None, matched: bool
) -> None:
    # GIVEN ECS's event for this cluster's task that stopped with this exit code (None: it never started)
    event = stopped(exit_code)
    # THEN the rule matches it unless the task succeeded
    assert matches(FAILED_TASK, event) is matched


def test_the_rule_ignores_other_clusters_and_tasks_still_running() -> None:
    assert not matches(FAILED_TASK, stopped(1, cluster=CLUSTER + "-other"))
    running = stopped(1)
    running["detail"]["lastStatus"] = "RUNNING"
    assert not matches(FAILED_TASK, running)


def test_a_task_of_several_containers_matches_when_any_exits_non_zero() -> None:
    event = stopped(0)
    event["detail"]["containers"].append({"name": "sidecar", "exitCode": 2})
    assert matches(FAILED_TASK, event)


@pytest.mark.parametrize(
    ("pattern", "event", "matched"),
    [
        ({"a": [{"prefix": "ser"}]}, {"a": "servestack"}, True),
        ({"a": [{"suffix": "-dlq"}]}, {"a": "jobs"}, False),
        ({"a": [{"exists": False}]}, {"b": 1}, True),
        ({"a": [{"exists": True}]}, {"b": 1}, False),
        ({"a": [{"anything-but": ["x", "y"]}]}, {"a": "z"}, True),
        ({"a": [{"anything-but": {"prefix": "x"}}]}, {"a": "xyz"}, False),
        ({"a": [{"anything-but": 0}]}, {}, False),  # an absent field is not "anything but"
        ({"a": [{"numeric": [">", 0, "<=", 5]}]}, {"a": 5}, True),
        ({"a": [{"numeric": [">", 0]}]}, {"a": "5"}, False),  # numeric compares numbers only
        ({"a": [{"equals-ignore-case": "Failed"}]}, {"a": "FAILED"}, True),
        ({"a": [{"wildcard": "job-*-done"}]}, {"a": "job-7-done"}, True),
        ({"a": [1]}, {"a": 1.0}, True),  # numbers compare as numbers
        ({"a": [True]}, {"a": 1}, False),
        ({"a": {"b": ["c"]}}, {"a": [{"b": "x"}, {"b": "c"}]}, True),  # an array of objects: any item
    ],
)
def test_each_comparison_operator(pattern: dict[str, Any], event: dict[str, Any], matched: bool) -> None:
    check(pattern)
    assert matches(pattern, event) is matched


@pytest.mark.parametrize(
    "pattern",
    [{"a": [{"cidr": "10.0.0.0/24"}]}, {"a": "not an array"}, {"$or": []}, {"a": [{"numeric": ["~", 1]}]}],
    ids=["an unknown operator", "a bare value", "an empty $or", "a bad comparison"],
)
def test_what_local_mode_does_not_match_is_refused_at_read_time(pattern: dict[str, Any]) -> None:
    with pytest.raises(PatternError):
        check(pattern)
