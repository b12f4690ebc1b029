"""`local up` of a Fargate batch deployment: its schedule's role may `ecs:RunTask` on `Ref` of the task
definition, which CloudFormation documents as the task definition's ARN. Local mode once resolved it to a name,
and the emulator's IAM refused the role's policy (`MalformedPolicyDocument: Resource ... must be in ARN
format`), so local up stopped before anything ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import copy_project, running

pytestmark = pytest.mark.slow
SPEC = """\
models:
  - name: digits
    version: 1
deployments:
  weekly:
    mode: batch
    model: digits
    engine: fargate
    schedule: rate(7 days)
"""


def test_local_up_runs_a_fargate_batch_deployment_with_its_schedule_role(tmp_path: Path) -> None:
    # GIVEN a project whose one deployment is a Fargate batch
    spec = copy_project(tmp_path / "project", SPEC)
    # WHEN local up reads its templates and creates its roles
    with running(tmp_path, "--fresh", "--data-dir", str(tmp_path / "data"), spec=spec) as up:
        # THEN it is up, and the schedule's role may run the task definition, named by its ARN
        role = next(name for name in up.state["identities"] if "SchedulerRole" in name)
        iam = up.emulator("iam")
        names = iam.list_role_policies(RoleName=role)["PolicyNames"]
        documents = [iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"] for name in names]
        statements = [s for d in documents for s in (json.loads(d) if isinstance(d, str) else d)["Statement"]]
        (run_task,) = [s for s in statements if s["Action"] == "ecs:RunTask"]
        assert run_task["Resource"].startswith("arn:aws:ecs:us-east-1:123456789012:task-definition/")
        assert run_task["Resource"].endswith(":1")
