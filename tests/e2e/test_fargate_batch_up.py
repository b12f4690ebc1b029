"""`local up` of a Fargate batch deployment: its schedule's role may `ecs:RunTask` on `Ref` of the task
definition, which CloudFormation documents as the task definition's ARN. Local mode once resolved it to a name,
and the emulator's IAM refused the role's policy (`MalformedPolicyDocument: Resource ... must be in ARN
format`), so local up stopped before anything ran."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import LocalUp

pytestmark = pytest.mark.slow
# weekly (a Fargate batch on `rate(7 days)`) of the shared local up (tests/e2e/conftest.py's SHARED_SPEC).
STACK = "servestack-weekly"


def test_local_up_runs_a_fargate_batch_deployment_with_its_schedule_role(shared_up: LocalUp) -> None:
    # GIVEN a project with a Fargate batch deployment (weekly)
    # WHEN local up has read its templates and created its roles
    up = shared_up
    # THEN it is up, and the schedule's role may run the task definition, named by its ARN
    role = next(n for n in up.state["identities"] if n.startswith(f"{STACK}-") and "SchedulerRole" in n)
    iam = up.emulator("iam")
    names = iam.list_role_policies(RoleName=role)["PolicyNames"]
    documents = [iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"] for name in names]
    statements = [s for d in documents for s in (json.loads(d) if isinstance(d, str) else d)["Statement"]]
    (run_task,) = [s for s in statements if s["Action"] == "ecs:RunTask"]
    assert run_task["Resource"].startswith("arn:aws:ecs:us-east-1:123456789012:task-definition/")
    assert run_task["Resource"].endswith(":1")
