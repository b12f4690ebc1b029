"""Issue 37, finding 7: each child of local up receives only its own role's keys.

The children and where their environment is made: a Lambda function's execution environment, a CodeDeploy hook
and an ECS task (from local up's environment without its caller's identity: `base_environment`, `task_process`,
then the role's keys); an endpoint's router (the developer's keys: it is SageMaker's side); the router's
containers and a transform job's workers (`RealtimeProcess.start` over an environment without the parent's
identity, then the execution role's keys, if any). tests/e2e/test_local_boundaries.py reads every child's
environment of a real `local up`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from servestack.local.ecs import TaskLaunch, task_process
from servestack.local.hosting import IDENTITY_VARIABLES, without_identity
from servestack.local.sagemaker.backends import VariantPlan
from servestack.local.sagemaker.router import Router
from servestack.local.up.environment import base_environment

PARENT = {
    "AWS_ACCESS_KEY_ID": "PARENTKEY",
    "AWS_SECRET_ACCESS_KEY": "parent-secret",
    "AWS_SESSION_TOKEN": "parent-token",
    "AWS_PROFILE": "prod",
    "AWS_DEFAULT_REGION": "us-east-1",
}
ROLE = {"AWS_ACCESS_KEY_ID": "ASIAROLE", "AWS_SECRET_ACCESS_KEY": "role-secret", "AWS_SESSION_TOKEN": "role-token"}


def parent_values_in(env: dict[str, str]) -> list[str]:
    return [value for key, value in PARENT.items() if key in IDENTITY_VARIABLES and value in env.values()]


def test_without_identity_drops_every_way_boto3_finds_keys() -> None:
    kept = without_identity({**PARENT, "PATH": "/bin", "AWS_ENDPOINT_URL": "http://e"})
    assert kept == {"AWS_DEFAULT_REGION": "us-east-1", "PATH": "/bin", "AWS_ENDPOINT_URL": "http://e"}


def test_local_ups_children_start_from_an_environment_without_its_callers_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in PARENT.items():
        monkeypatch.setenv(key, value)
    assert parent_values_in(base_environment()) == []


def test_a_task_gets_its_task_roles_keys_alone() -> None:
    launch = TaskLaunch("arn:td", "c", ("true",), "/", {"AWS_ACCESS_KEY_ID": "IMAGEKEY"}, "role", (), "tag")
    _, _, env = task_process(launch, host_environment=PARENT, endpoints={}, keys={**ROLE, "arn": "arn:role"})
    assert {k: env[k] for k in ROLE} == ROLE
    assert parent_values_in(env) == []


@pytest.mark.parametrize("plan_keys", [ROLE, {}], ids=["execution-role", "none"])
def test_an_endpoints_container_gets_its_execution_roles_keys_never_the_routers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plan_keys: dict[str, str]
) -> None:
    # GIVEN a router holding the developer's keys (as local up starts it), and a variant with its role's keys
    for key, value in PARENT.items():
        monkeypatch.setenv(key, value)
    dump = tmp_path / "env.json"
    script = f"import json, os; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))"
    plan = VariantPlan("v", "m", "1", 1.0, tmp_path, dict(plan_keys), argv=(sys.executable, "-c", script))
    router = Router("keys", [plan])
    # WHEN the router starts the variant's container
    child = router.spawn(plan)
    assert child.process.wait(timeout=60) == 0
    env = json.loads(dump.read_text())
    # THEN it holds its own role's keys (or none), and nothing of the router's
    assert parent_values_in(env) == []
    assert {k: env.get(k) for k in ROLE} == ({**ROLE} if plan_keys else dict.fromkeys(ROLE))
