"""`local up` of a Fargate batch deployment: its schedule's role may `ecs:RunTask` on `Ref` of the task
definition, which CloudFormation documents as the task definition's ARN. Local mode once resolved it to a name,
and the emulator's IAM refused the role's policy (`MalformedPolicyDocument: Resource ... must be in ARN
format`), so local up stopped before anything ran.

A failed run of it, as a user meets one: local up seeds its input as it seeds a Lambda deployment's; with the
input gone, `local run-batch` says why the task failed, and `local status` shows the failure alarm that ECS's
task state change event raised through the deployment's failed-task rule (servestack/cdk/batch.py)."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from servestack.local.emulator import control, developer
from tests.conftest import REPO_ROOT
from tests.e2e.conftest import SERVESTACK, LocalUp

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


def cli(up: LocalUp, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, "local", *args, "--state", str(up.state_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def weekly_alarms(up: LocalUp) -> list[dict[str, object]]:
    shown = cli(up, "status", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = [r for r in json.loads(shown.stdout)["deployments"] if r["deployment"] == "weekly"]
    alarms: list[dict[str, object]] = row["alarms"]
    return alarms


@pytest.mark.timeout(900)
def test_a_failed_fargate_run_says_why_and_local_status_shows_its_alarm(shared_up: LocalUp) -> None:
    # GIVEN the Fargate deployment, whose input prefix local up seeded with its model's sample rows
    up = shared_up
    entry = up.deployment("weekly")
    bucket, prefix = entry["input"]["bucket"], entry["input_prefix"]
    s3 = up.emulator("s3")
    assert entry["seeded"] == f"{prefix}servestack-sample.jsonl"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]] == [entry["seeded"]]
    # AND its failure alarm, quiet
    assert [(a["name"], a["state"]) for a in weekly_alarms(up)] == [("servestack-weekly-failures", "OK")]
    # WHEN its input is gone and it runs
    s3.delete_object(Bucket=bucket, Key=entry["seeded"])
    ran = cli(up, "run-batch", "weekly")
    # THEN the run fails, saying why (the task's exit code and reason), and no traceback is shown
    said = ran.stdout + ran.stderr
    assert ran.returncode == 1, said[-4000:]
    assert f"weekly: the run failed, its task exited 66: NoInput: no input under s3://{bucket}/{prefix}" in said
    assert "Traceback" not in said
    assert "weekly: alarm servestack-weekly-failures is ALARM" in said
    # AND local status shows the alarm in ALARM, with CloudWatch's reason
    (alarm,) = weekly_alarms(up)
    assert alarm["state"] == "ALARM"
    assert str(alarm["reason"]).startswith("Threshold Crossed: 1 datapoint [1.0")
    table = cli(up, "status").stdout
    assert re.search(r"^weekly +batch +idle +s3://\S+ +1 +0 +ALARM$", table, re.MULTILINE), table
    assert "servestack-weekly-failures: ALARM since " in table
    # WHEN its schedule fires with the input still gone (local up's own route: now, as at its next time)
    fire = f"{up.api}/_servestack/schedules/{entry['schedule_name']}/fire"
    assert control("POST", fire, developer(up.state), "us-east-1", timeout_sec=300) == (200, {"invoked": True})
    # THEN RunTask succeeded (the schedule saw no error), and the task's failure reached the rule all the same: two
    # failed runs counted in its TriggeredRules
    ((rule_name,),) = [[r["name"] for r in entry["rules"]]]
    counted = up.emulator("cloudwatch").get_metric_statistics(
        Namespace="AWS/Events", MetricName="TriggeredRules", Dimensions=[{"Name": "RuleName", "Value": rule_name}],
        StartTime=datetime.now(UTC) - timedelta(minutes=10), EndTime=datetime.now(UTC) + timedelta(minutes=1),
        Period=3600, Statistics=["Sum"],
    )["Datapoints"]  # fmt: skip
    assert sum(point["Sum"] for point in counted) == 2
    assert weekly_alarms(up)[0]["state"] == "ALARM"
