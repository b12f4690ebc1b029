"""An ECS task as local mode starts it (servestack/local/ecs/tasks.py): the task definition's container laid out
from its image's staged build context as Docker and ECS would start it, and RunTask's authorization as the
caller (ecs:RunTask on the task definition, iam:PassRole of each of its roles to ECS)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest

from servestack.local.ecs.tasks import (
    ECS_TASKS_SERVICE,
    EcsRunTask,
    TaskImageError,
    TaskLaunch,
    run_task_refusal,
    task_launch,
    task_process,
)
from servestack.local.hosting.http_server import Reply, Request
from servestack.local.iam.operations import Check, Where, describe
from servestack.local.iam.wire import HttpRequest
from servestack.local.stack.topology import TaskDef

TAG = "a" * 64
IMAGE_URI = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-hnb659fds-container-assets-123456789012-us-east-1:{TAG}"
TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task-definition/weekly:1"
TASK_ROLE = "arn:aws:iam::123456789012:role/weekly-TaskRole"
EXECUTION_ROLE = "arn:aws:iam::123456789012:role/weekly-ExecutionRole"
DOCKERFILE = """\
FROM python:3.12-slim
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH GREETING=image
WORKDIR /opt/program
COPY models ./models
COPY app ./app
ENTRYPOINT ["python", "-m", "app.main"]
CMD ["serve"]
"""


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A cloud assembly with one image asset: its staged context holds a model package, code, and a file the
    context's .dockerignore excludes."""
    out = tmp_path / "cdk.out"
    context = out / f"asset.{TAG}"
    (context / "models" / "artifacts" / "digits" / "1").mkdir(parents=True)
    (context / "models" / "artifacts" / "digits" / "1" / "manifest.json").write_text("{}")
    (context / "app").mkdir()
    (context / "app" / "main.py").write_text("print('hello')\n")
    (context / "app" / "notes.secret").write_text("not shipped")
    (context / ".dockerignore").write_text("**/*.secret\n")
    (context / "Dockerfile").write_text(DOCKERFILE)
    assets = {
        "dockerImages": {
            TAG: {
                "source": {"directory": f"asset.{TAG}", "dockerFile": "Dockerfile"},
                "destinations": {"current": {"imageTag": TAG}},
            }
        }
    }
    (out / "stack.assets.json").write_text(json.dumps(assets))
    return out


def task(**changes: object) -> TaskDef:
    values: dict[str, object] = {
        "logical_id": "Task",
        "arn": TASK_ARN,
        "argv": ("python", "-m", "app.main"),
        "environment": {"SERVESTACK_MODEL_DIR": "/opt/program/models/artifacts", "GREETING": "task", "NAME": "x"},
        "task_role": "TaskRole",
        "execution_role": "ExecutionRole",
        "container": "batch",
        "image": IMAGE_URI,
        "entry_point": ("python", "-m", "app.main"),
        "command": (),
    }
    return TaskDef(**(values | changes))  # type: ignore[arg-type]


TOPOLOGY = SimpleNamespace(
    roles={
        "TaskRole": SimpleNamespace(name="weekly-TaskRole", arn=TASK_ROLE),
        "ExecutionRole": SimpleNamespace(name="weekly-ExecutionRole", arn=EXECUTION_ROLE),
    }
)


def test_the_task_runs_from_its_staged_image_with_the_task_definitions_entry_point_and_environment(
    out_dir: Path, tmp_path: Path
) -> None:
    # WHEN the task definition's container is laid out from its image's staged build context
    launch = task_launch(TOPOLOGY, task(), out_dir, tmp_path / "images")
    root = Path(launch.cwd).parents[1]
    # THEN it starts in the image's WORKDIR, among the files the Dockerfile COPYs (minus .dockerignore)
    assert Path(launch.cwd) == root / "opt" / "program"
    assert (Path(launch.cwd) / "app" / "main.py").is_file()
    assert not (Path(launch.cwd) / "app" / "notes.secret").exists()
    # AND the task definition's EntryPoint replaces the image's, without the image's CMD; `python` is the
    # image's venv's, which the developer's stands for
    assert launch.argv[1:] == ("-m", "app.main")
    assert Path(launch.argv[0]).parent == Path(sys.prefix) / "bin"
    # AND its Environment goes over the image's ENV, its container paths into the staged image
    assert launch.environment["GREETING"] == "task"
    assert launch.environment["SERVESTACK_MODEL_DIR"] == str(Path(launch.cwd) / "models" / "artifacts")
    assert launch.environment["NAME"] == "x"
    # AND the roles RunTask passes are the task role and the execution role
    assert launch.role == "weekly-TaskRole"
    assert launch.passed_roles == (TASK_ROLE, EXECUTION_ROLE)
    assert TaskLaunch.from_dict(json.loads(json.dumps(launch.to_dict()))) == launch


def test_a_command_without_an_entry_point_follows_the_images_entrypoint(out_dir: Path, tmp_path: Path) -> None:
    launch = task_launch(TOPOLOGY, task(entry_point=(), command=("batch", "--now")), out_dir, tmp_path / "images")
    assert Path(launch.argv[0]).name == "python"
    assert launch.argv[1:] == ("-m", "app.main", "batch", "--now")


def test_an_image_that_is_not_an_asset_of_the_assembly_is_refused_by_name(out_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TaskImageError, match=re.escape("public.ecr.aws/other:1 is not an image asset")):
        task_launch(TOPOLOGY, task(image="public.ecr.aws/other:1"), out_dir, tmp_path / "images")


def test_the_process_gets_the_role_keys_and_overrides_never_the_hosts_identity(out_dir: Path, tmp_path: Path) -> None:
    launch = task_launch(TOPOLOGY, task(), out_dir, tmp_path / "images")
    host = {"HOME": "/home/dev", "AWS_ACCESS_KEY_ID": "developer", "AWS_PROFILE": "dev", "PYTHONPATH": "/src"}
    argv, cwd, env = task_process(
        launch,
        host_environment=host,
        endpoints={"AWS_ENDPOINT_URL": "http://127.0.0.1:1"},
        keys={"arn": "role", "AWS_ACCESS_KEY_ID": "task", "AWS_SECRET_ACCESS_KEY": "s"},
        overrides={"NAME": "override"},
    )
    assert (argv, cwd) == (list(launch.argv), launch.cwd)
    assert env["AWS_ACCESS_KEY_ID"] == "task"
    assert "AWS_PROFILE" not in env
    assert "arn" not in env
    assert env["PYTHONPATH"] == launch.cwd  # the image's code, not the developer's
    assert env["NAME"] == "override"
    assert env["HOME"] == "/home/dev"


class Policy:
    """An authorizer that allows what it lists ((action, resource)) and records every question."""

    def __init__(self, allowed: set[tuple[str, str]]) -> None:
        self.allowed = allowed
        self.asked: list[tuple[str, str, str, Mapping[str, str] | None]] = []

    def __call__(self, caller: str, action: str, resource: str, context: Mapping[str, str] | None) -> str | None:
        self.asked.append((caller, action, resource, context))
        return None if (action, resource) in self.allowed else f"{caller} is not authorized to perform: {action}"


LAUNCH = TaskLaunch(TASK_ARN, "batch", ("python",), "/", {}, "weekly-TaskRole", (TASK_ROLE, EXECUTION_ROLE), TAG)
EVERYTHING = {("ecs:RunTask", TASK_ARN), ("iam:PassRole", TASK_ROLE), ("iam:PassRole", EXECUTION_ROLE)}


def test_run_task_needs_run_task_on_the_definition_and_pass_role_of_each_role_to_ecs() -> None:
    policy = Policy(EVERYTHING)
    assert run_task_refusal(policy, "scheduler-role", LAUNCH) is None
    assert policy.asked == [
        ("scheduler-role", "ecs:RunTask", TASK_ARN, None),
        ("scheduler-role", "iam:PassRole", TASK_ROLE, {"iam:PassedToService": ECS_TASKS_SERVICE}),
        ("scheduler-role", "iam:PassRole", EXECUTION_ROLE, {"iam:PassedToService": ECS_TASKS_SERVICE}),
    ]


@pytest.mark.parametrize("missing", sorted(EVERYTHING))
def test_run_task_is_refused_without_any_one_of_its_permissions(missing: tuple[str, str]) -> None:
    refused = run_task_refusal(Policy(EVERYTHING - {missing}), "scheduler-role", LAUNCH)
    assert refused == f"AccessDeniedException: scheduler-role is not authorized to perform: {missing[0]}"


def test_ecs_run_task_requests_authorize_run_task_on_the_task_definition() -> None:
    def run_task(definition: str) -> HttpRequest:
        headers = {"x-amz-target": "AmazonEC2ContainerServiceV20141113.RunTask"}
        return HttpRequest("POST", "/", "", headers, json.dumps({"taskDefinition": definition}).encode())

    where = Where("us-east-1", "123456789012")
    assert describe(run_task(TASK_ARN), "ecs", where).checks == (Check("ecs:RunTask", TASK_ARN),)
    assert describe(run_task("weekly:1"), "ecs", where).checks == (Check("ecs:RunTask", TASK_ARN),)
    other = HttpRequest("POST", "/", "", {"x-amz-target": "AmazonEC2ContainerServiceV20141113.StopTask"}, b"{}")
    assert not describe(other, "ecs", where).recognised


class Access:
    """local up's IAM as the front sees it: the caller's fields once SigV4 and the request's own check pass, then
    `authorize` for the checks the front makes as the caller's role."""

    def __init__(self, policy: Policy, refusal: Reply | None = None) -> None:
        self.policy = policy
        self.refusal = refusal

    def check(self, request: Request, service: str) -> dict[str, str] | Reply:
        assert service == "ecs"
        return self.refusal or {"userArn": "arn:aws:sts::123456789012:assumed-role/weekly-SchedulerRole/local"}

    def authorize(
        self, caller: str, action: str, resource: str, context: Mapping[str, str] | None = None
    ) -> str | None:
        return self.policy(caller, action, resource, context)


def run_task_call(body: dict[str, object], operation: str = "RunTask") -> Request:
    headers = {"x-amz-target": f"AmazonEC2ContainerServiceV20141113.{operation}"}
    return Request("POST", "/", {}, headers, json.dumps(body).encode())


def test_local_ups_run_task_accepts_the_task_as_the_callers_role() -> None:
    policy = Policy(EVERYTHING)
    front = EcsRunTask({"weekly/Task": LAUNCH}, Access(policy), "us-east-1", "123456789012")
    reply = front.handle(run_task_call({"taskDefinition": TASK_ARN, "overrides": {"containerOverrides": []}}))
    assert reply.status == 200
    (task,) = json.loads(reply.body)["tasks"]
    assert task["taskDefinitionArn"] == TASK_ARN
    assert task["taskArn"].startswith("arn:aws:ecs:us-east-1:123456789012:task/default/")
    assert {caller for caller, *_ in policy.asked} == {"arn:aws:iam::123456789012:role/weekly-SchedulerRole"}


def test_local_ups_run_task_refuses_what_the_role_may_not_pass_and_what_it_does_not_know() -> None:
    front = EcsRunTask({"weekly/Task": LAUNCH}, Access(Policy(EVERYTHING - {("iam:PassRole", TASK_ROLE)})), "r", "a")
    refused = front.handle(run_task_call({"taskDefinition": TASK_ARN}))
    assert (refused.status, json.loads(refused.body)["__type"]) == (400, "AccessDeniedException")
    assert "iam:PassRole" in json.loads(refused.body)["message"]
    unknown = front.handle(run_task_call({"taskDefinition": TASK_ARN + "9"}))
    assert (unknown.status, json.loads(unknown.body)["__type"]) == (400, "ClientException")
    other = front.handle(run_task_call({}, operation="StopTask"))
    assert (other.status, json.loads(other.body)["__type"]) == (400, "UnknownOperationException")
    denied = Reply(403, {}, b"denied")
    assert EcsRunTask({}, Access(Policy(EVERYTHING), denied), "r", "a").handle(run_task_call({})) is denied
