"""A mutation test of the whole IAM surface: for every Allow statement of every role in the four modes'
templates, removing it makes an exercise of its deployment fail locally, or the statement is listed in
tests/e2e/iam_unexercised.txt with the reason no local run can exercise it.

One `local up` serves every mutation: the statement is removed from the running IAM store
(servestack/local/iam/roles_route.py), which holds the templates' resolved statements and decides each call as the
templates without that statement would; the exercise runs; the statement is put back and the same exercise
must pass again. Sampled by default (a few statements chosen by the UTC date, tests/e2e/iam_surface.py);
`SERVESTACK_IAM_MUTATION=full` mutates every statement and prints the table (statements, caught, listed)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LocalUp, start_local_up
from tests.e2e.iam_surface import (
    EXERCISES,
    FULL_ENV,
    Statement,
    cli,
    log_groups,
    logged_since,
    realtime,
    release,
    sample,
    scheduled_failure_is_dead_lettered,
    stack_update,
    statements,
    store,
    unexercised,
    without,
)

# The full mode mutates every statement, each with its deployment's exercises: minutes, not the default limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600 if os.environ.get(FULL_ENV) == "full" else 300)]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    where = tmp_path_factory.mktemp("surface")
    local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"))
    yield local
    assert local.stop() == 0, local.log_text()[-4000:]


def deployment_of(up: LocalUp, role: str) -> str:
    """The deployment whose stack created the role: CloudFormation names a role `<stack>-<logical id>-<suffix>`,
    each part cut to fit 64 characters, so the stack whose name shares the longest start with it."""
    stacks = up.state["stacks"]
    shared = {stack: len(os.path.commonprefix([stack + "-", role])) for stack in stacks}  # noqa: RUF071 - names
    best = max(shared, key=lambda stack: shared[stack])
    assert shared[best] >= len("servestack-") + 1, f"{role}: of none of local up's stacks ({', '.join(stacks)})"
    return str(stacks[best]["deployment"])


# deployment -> the log groups its exercise writes to with every statement in place (found by the first run)
LOGGED: dict[str, set[str]] = {}


def exercise(up: LocalUp, deployment: str, scratch: Path) -> str | None:
    """The deployment's exercise; it fails too when a log group its first run wrote to got no line this time
    (a function's or a container's lines are written to its group with its role's keys)."""
    start_ms = int(time.time() * 1000)  # lines of an earlier exercise, shipped late, carry earlier times
    failure = EXERCISES[up.deployment(deployment)["mode"]](up, deployment, scratch)
    if failure is not None:
        return failure
    groups = log_groups(up, deployment)
    if deployment in LOGGED:  # until the groups its first run wrote to have a line (20 s at most)
        fresh = logged_since(up, groups, start_ms, expected=LOGGED[deployment])
    else:  # the first run: whichever of its groups get a line within 10 s are the ones it writes to
        fresh = logged_since(up, groups, start_ms, wait_sec=10)
    expected = LOGGED.setdefault(deployment, fresh)
    missing = sorted(expected - fresh)
    return f"no log line reached {', '.join(missing)} during the exercise" if missing else None


def mutated(up: LocalUp, roles: dict[str, Any], statement: Statement, scratch: Path) -> str | None:
    """The failure of the statement's deployment's exercise with the statement removed from the running store
    (None: it passed without it); the statement is put back, and the exercise must pass again."""
    deployment = deployment_of(up, statement.role)
    store(up, "PUT", statement.role, without(roles, statement))
    try:
        failure = exercise(up, deployment, scratch)
    finally:
        store(up, "PUT", statement.role, roles[statement.role]["policies"])
    if failure is not None:
        assert exercise(up, deployment, scratch) is None, f"{deployment}: still fails after restoring"
    return failure


def test_every_statement_is_caught_or_listed_with_its_reason(up: LocalUp, tmp_path: Path) -> None:
    # GIVEN every Allow statement of every role local up holds, and the listed ones
    roles = store(up)["roles"]
    surface = statements(roles)
    listed = unexercised()
    stale = [entry for entry in listed if not any(entry.covers(s) for s in surface)]
    assert not stale, f"iam_unexercised.txt lists statements no template has: {stale}"
    candidates = [s for s in surface if not any(entry.covers(s) for entry in listed)]
    excused = [s for s in surface if s not in candidates]
    full = os.environ.get(FULL_ENV) == "full"
    chosen = candidates if full else sample(candidates)
    for deployment in sorted({deployment_of(up, s.role) for s in chosen}):  # each passes as the templates are
        assert exercise(up, deployment, tmp_path) is None, f"{deployment}: fails with every statement in place"
    # WHEN each chosen statement is removed from its role in the running store and its deployment is exercised
    caught = {s: mutated(up, roles, s, tmp_path) for s in chosen}
    # (full mode also tries the listed ones: one that is caught now should leave the list)
    now_caught = [s for s in excused if full and mutated(up, roles, s, tmp_path) is not None]
    # THEN every exercise failed without its statement
    missed = [s for s, failure in caught.items() if failure is None]
    table = (
        f"\nIAM mutation ({'full' if full else 'sampled'}): {len(surface)} statements, {len(chosen)} mutated, "
        f"{len(chosen) - len(missed)} caught, {len(excused)} listed with reasons, {len(missed)} missed"
        + "".join(f"\n  caught: {s.label}\n     by: {str(f).strip().splitlines()[-1][:200]}"
                  for s, f in caught.items() if f is not None)
        + "".join(f"\n  MISSED: {s.label}" for s in missed)
        + "".join(f"\n  listed: {s.label}" for s in excused)
        + "".join(f"\n  listed, but caught now (take it off the list): {s.label}" for s in now_caught)
    )  # fmt: skip
    print(table)  # a listed statement caught now is for a reader to take off the list (a run may be flaky)
    assert not missed, table


def remove(up: LocalUp, role_fragment: str, action: str) -> tuple[str, dict[str, Any]]:
    """Remove the statement of the role named like `role_fragment` that allows `action`; returns the role and
    its documents as they were, to put back."""
    roles = store(up)["roles"]
    found = [s for s in statements(roles) if role_fragment in s.role and action in s.actions]
    assert len(found) == 1, f"{role_fragment} {action}: {[s.label for s in found]}"
    store(up, "PUT", found[0].role, without(roles, found[0]))
    return found[0].role, roles[found[0].role]["policies"]


def test_local_run_batch_starts_the_run_as_the_schedules_role(up: LocalUp) -> None:
    # GIVEN the schedule's role without its lambda:InvokeFunction statement on the batch function
    role, policies = remove(up, "BatchSchedulerRole", "lambda:InvokeFunction")
    try:
        # WHEN `local run-batch` runs the batch deployment
        refused = cli("local", "run-batch", "cancer-nightly", "--state", str(up.state_path))
    finally:
        store(up, "PUT", role, policies)
    # THEN the run is refused to the schedule's role, as the schedule would be, and passes with the statement back
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "AccessDenied" in refused.stderr
    assert "lambda:InvokeFunction" in refused.stderr
    assert f"assumed-role/{role}/" in refused.stderr
    assert cli("local", "run-batch", "cancer-nightly", "--state", str(up.state_path)).returncode == 0


@pytest.mark.parametrize(
    ("role_fragment", "action", "denied"),
    [
        ("PreTrafficHookRole", "codedeploy:PutLifecycleEventHookExecutionStatus", None),
        ("PreTrafficHookRole", "lambda:InvokeFunction", None),
        # the service role's statements (servestack/cdk/serverless.py): one allows the alias calls, of which the release
        # makes GetAlias first; one the group's alarm reads; CDK's the hook's invoke
        ("DeploymentServiceRo", "lambda:UpdateAlias", "lambda:GetAlias"),
        ("DeploymentServiceRo", "cloudwatch:DescribeAlarms", None),
        ("DeploymentServiceRo", "lambda:InvokeFunction", None),
    ],
)
def test_a_serverless_release_runs_the_hook_and_the_shift_under_their_roles(
    up: LocalUp, tmp_path: Path, role_fragment: str, action: str, denied: str | None
) -> None:
    # GIVEN a serverless deployment whose release passes with the templates' statements
    assert release(up, "digits-api", tmp_path) is None
    outcome = json.loads((tmp_path / "deploy-digits-api.json").read_text())
    assert outcome["status"] == "Succeeded"
    assert any("BeforeAllowTraffic: Succeeded" in m for m in outcome["deploymentStatusMessages"])
    assert any("traffic shifted: 100%" in m for m in outcome["deploymentStatusMessages"])
    # WHEN one statement of the hook's role or of the CodeDeploy service role is removed
    role, policies = remove(up, role_fragment, action)
    try:
        failed = release(up, "digits-api", tmp_path)
    finally:
        store(up, "PUT", role, policies)
    # THEN the release fails with the AccessDenied of the action (CodeDeploy's own, or the one the hook reported)
    assert failed is not None
    outcome = json.loads((tmp_path / "deploy-digits-api.json").read_text())
    assert outcome["status"] == "Failed"
    assert "AccessDenied" in outcome["errorInformation"]["message"]
    assert (denied or action) in outcome["errorInformation"]["message"]


def test_a_failed_scheduled_run_reaches_the_dead_letter_queue_as_the_schedules_role(up: LocalUp) -> None:
    # GIVEN the batch schedule fired while its role may not invoke the target: the event is dead-lettered
    assert scheduled_failure_is_dead_lettered(up, "cancer-nightly") is None
    # WHEN the schedule's role also lacks sqs:SendMessage on its dead-letter queue
    role, policies = remove(up, "BatchSchedulerRole", "sqs:SendMessage")
    try:
        # (the queue stays empty 10 s: a send refused when the schedule gives up never comes later)
        failed = scheduled_failure_is_dead_lettered(up, "cancer-nightly", wait_sec=10)
    finally:
        store(up, "PUT", role, policies)
    # THEN the send is refused (the schedule's log line), so no event reaches the queue
    assert failed == "the schedule's refused invocation never reached its dead-letter queue"


def test_a_stack_update_runs_the_bucket_notification_handler_under_its_role(up: LocalUp) -> None:
    # GIVEN the async deployment's notification handler role without its s3:PutBucketNotification statement
    role, policies = remove(up, "BucketNotificationsHandler", "s3:PutBucketNotification")
    try:
        # WHEN the stack is updated (CloudFormation runs the handler again)
        refused = stack_update(up, "cancer-async")
    finally:
        store(up, "PUT", role, policies)
    # THEN the update fails with S3's AccessDenied to the handler's role, and passes with the statement back
    assert refused is not None
    assert "409" in refused
    assert "AccessDenied" in refused
    assert "s3:PutBucketNotification" in refused
    assert f"as role {role}" in refused
    assert stack_update(up, "cancer-async") is None


@pytest.mark.parametrize("action", ["s3:GetObject", "ecr:GetAuthorizationToken", "logs:PutLogEvents"])
def test_a_realtime_redeploy_starts_its_green_fleet_as_a_variant_starts(
    up: LocalUp, tmp_path: Path, action: str
) -> None:
    # GIVEN the realtime deployment, redeployed with the templates' statements (its green fleet's start lines
    # reach the endpoint's log group)
    group = up.deployment("digits-realtime")["log_groups"]["servestack-digits-realtime"]
    start_ms = int(time.time() * 1000)
    assert realtime(up, "digits-realtime", tmp_path) is None
    assert logged_since(up, [group], start_ms) == {group}
    # WHEN the execution role's statement allowing `action` is removed and it is redeployed again
    role, policies = remove(up, "RealtimeExecutionRole", action)
    try:
        start_ms = int(time.time() * 1000)
        failed = realtime(up, "digits-realtime", tmp_path)
        # (3 s without a line is enough: its lines are refused as they are shipped, so none comes later)
        logged = logged_since(up, [group], start_ms, wait_sec=3)
    finally:
        store(up, "PUT", role, policies)
    outcome = json.loads((tmp_path / "deploy-digits-realtime.json").read_text())
    if action.startswith("logs:"):
        # THEN a green fleet without its log writes starts, and none of its lines reaches the group
        assert failed is None, failed
        assert logged == set()
        return
    # THEN the green fleet does not start: the rehearsal fails with the AccessDenied of the action, as the role
    assert failed is not None
    assert outcome["state"] == "failed"
    reason = outcome["timeline"][-1]["reason"]
    assert "AccessDenied" in reason, reason
    assert action in reason, reason
    assert role in reason, reason
