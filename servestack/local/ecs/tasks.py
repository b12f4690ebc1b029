"""An ECS task of the templates as local mode starts it: RunTask authorized as its caller, then the task
definition's one container run as a process from the image's staged build context in cdk.out.

Authorization (`run_task_refusal`, the one check for both starters: the scheduler's ECS target in local up and
`local run-batch` through local up's ECS `RunTask`): ECS authorizes `ecs:RunTask` on the task definition, and
the caller must pass each role the task definition names, `iam:PassRole` with `iam:PassedToService`
`ecs-tasks.amazonaws.com` (the Amazon ECS Developer Guide, "Amazon ECS EventBridge IAM role": "If your scheduled
tasks require the use of the task execution role, a task role, or a task role override, then you must add
iam:PassRole permissions for each ... to the EventBridge IAM role").

The process (`TaskLaunch`, `task_process`): the image is read and its files staged as for a SageMaker container
(servestack/local/sagemaker/container.py, servestack/local/sagemaker/dockerfile.py: COPY minus .dockerignore,
ENV, WORKDIR). ECS
then applies the container definition as Docker's create-container does: its `EntryPoint` replaces the image's
ENTRYPOINT (and the image's CMD is then not used), its `Command` replaces CMD, its `Environment` goes over the
image's ENV, and RunTask's `containerOverrides` environment over that. Container paths in the task's
environment (`SERVESTACK_MODEL_DIR` under WORKDIR) point into the staged image, never into the working tree.
The task role's keys and the emulator's endpoint stand for the container credentials ECS serves.

When the task stops, ECS's "ECS Task State Change" event goes to EventBridge (`report_task_stopped`, through
servestack/local/events/): the rules local mode plays match it, which is how a Fargate batch deployment's failure
alarm learns of a failed run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.local.hosting import Reply, Request

ECS_TASKS_SERVICE = "ecs-tasks.amazonaws.com"
ECS_TARGET_PREFIX = "AmazonEC2ContainerServiceV20141113."
# (caller role ARN, action, resource, context) -> None when allowed, else why not (servestack/local/iam/access.py)
Authorize = Callable[[str, str, str, Mapping[str, str] | None], str | None]


class TaskImageError(ValueError):
    """The task definition's image cannot be run locally (not an image asset of the assembly, or a Dockerfile
    local mode does not read); the message says which."""


@dataclass(frozen=True)
class TaskLaunch:
    """What starting the task definition's container takes here (the state file's `task` of a deployment)."""

    arn: str  # the task definition's
    container: str  # the container definition's name (RunTask's containerOverrides name it)
    argv: tuple[str, ...]
    cwd: str  # the image's WORKDIR in its staged files
    environment: dict[str, str]  # the image's ENV and the task definition's Environment, paths mapped; no keys
    role: str | None  # the task role's name (its keys are the state file's identities)
    passed_roles: tuple[str, ...]  # ARNs of the roles RunTask passes: task role, execution role
    image: str  # the staged image's asset tag

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskLaunch:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["argv"] = tuple(values["argv"])
        values["passed_roles"] = tuple(values["passed_roles"])
        return cls(**values)


def task_launch(topology: Any, task: Any, out_dir: Path, images_dir: Path) -> TaskLaunch:
    """The launch of `task` (a TaskDef of `topology`, servestack/local/stack/topology.py) from its image's staged
    build context; TaskImageError when the image cannot run here."""
    from servestack.local.cloudformation import image_asset
    from servestack.local.sagemaker import DockerfileError, container_command, image_venv, read_image, stage_root

    asset = image_asset(out_dir, task.image)
    if asset is None:
        raise TaskImageError(f"task definition {task.logical_id}: {task.image} is not an image asset of cdk.out")
    try:
        image = read_image(asset)
        root = stage_root(image, asset.context, images_dir / asset.tag[:24] / "rootfs")
        if task.entry_point:  # Docker: an entrypoint given at create drops the image's CMD
            image = dataclasses.replace(image, entrypoint=tuple(task.entry_point), cmd=())
        arguments = tuple(task.command) if task.command else None
        command = container_command(image, root, arguments, venv=image_venv(image, root))
    except DockerfileError as error:
        raise TaskImageError(f"task definition {task.logical_id}: its image cannot run locally: {error}") from None
    environment = dict(command.environment)
    for key, value in task.environment.items():
        staged = root / value.lstrip("/")
        environment[key] = str(staged) if value.startswith("/") and staged.exists() else value
    task_role = topology.roles.get(task.task_role or "")
    passed = [topology.roles.get(r or "") for r in (task.task_role, task.execution_role)]
    return TaskLaunch(
        arn=task.arn,
        container=task.container,
        argv=command.argv,
        cwd=str(command.cwd),
        environment=environment,
        role=task_role.name if task_role is not None else None,
        passed_roles=tuple(role.arn for role in passed if role is not None),
        image=asset.tag,
    )


def run_task_refusal(authorize: Authorize, caller_role_arn: str, launch: TaskLaunch) -> str | None:
    """Whether the role may RunTask the launch's task definition: None, or the AccessDenied line."""
    denied = authorize(caller_role_arn, "ecs:RunTask", launch.arn, None)
    for role in launch.passed_roles:
        if denied is not None:
            break
        denied = authorize(caller_role_arn, "iam:PassRole", role, {"iam:PassedToService": ECS_TASKS_SERVICE})
    return None if denied is None else f"AccessDeniedException: {denied}"


def task_process(
    launch: TaskLaunch,
    *,
    host_environment: Mapping[str, str],
    endpoints: Mapping[str, str],
    keys: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
) -> tuple[list[str], str, dict[str, str]]:
    """(argv, cwd, environment) of the task's container: this machine's environment without its AWS identity,
    the AWS endpoints, the launch's (image and task definition), RunTask's overrides, then the task role's keys."""
    own = {
        k: v for k, v in host_environment.items() if not k.startswith("AWS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    environment = own | dict(endpoints) | launch.environment | dict(overrides or {})
    environment |= {k: v for k, v in keys.items() if k.startswith("AWS_")}
    return list(launch.argv), launch.cwd, environment


def batch_overrides(overrides: Mapping[str, Any]) -> dict[str, str]:
    """`local run-batch`'s options as the SERVESTACK_BATCH_* variables the batch task reads
    (servestack/adapters/batch.py)."""
    return {
        f"SERVESTACK_BATCH_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in overrides.items()
        if v is not None
    }


def role_of_session(caller_arn: str) -> str:
    """`arn:aws:sts::<account>:assumed-role/<name>/<session>` -> `arn:aws:iam::<account>:role/<name>`."""
    head, _, rest = caller_arn.partition(":assumed-role/")
    if not rest:
        return caller_arn
    account = head.rsplit(":", 1)[-1]
    return f"arn:aws:iam::{account}:role/{rest.split('/', 1)[0]}"


def run_task_request(launch: TaskLaunch, overrides: Mapping[str, str], cluster: str | None = None) -> dict[str, Any]:
    """RunTask's parameters for the launch with `overrides` as its container's environment override, on `cluster`
    (the schedule target's; ECS's default cluster without one)."""
    environment = [{"name": k, "value": v} for k, v in overrides.items()]
    return {
        **({"cluster": cluster} if cluster else {}),
        "taskDefinition": launch.arn,
        "launchType": "FARGATE",
        "count": 1,
        "overrides": {"containerOverrides": [{"name": launch.container, "environment": environment}]},
    }


def task_endpoints(endpoint_url: str, aws_api_url: str, region: str) -> dict[str, str]:
    """Where the task's AWS calls go: the emulator, and local up's front for SageMaker Runtime and Lambda."""
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": aws_api_url,
        "AWS_ENDPOINT_URL_LAMBDA": aws_api_url,
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
    }


# ------------------------------------------------------------------------------------------ RunTask on local up


class EcsRunTask:
    """ECS `RunTask` on local up's AWS API port (boto3's `ecs` client): SigV4 and `ecs:RunTask` on the task
    definition (servestack/local/iam/operations.py), then `run_task_refusal` as the caller's role, as the
    scheduler's ECS target checks it. Accepted, it answers the task as PROVISIONING; the caller (`local
    run-batch`) then runs the task's process itself (`task_process`), so that its output and exit code are the
    command's. Other ECS operations are not answered."""

    def __init__(self, launches: Mapping[str, TaskLaunch], access: Any, region: str, account: str) -> None:
        self.launches = {launch.arn: launch for launch in launches.values()}
        self.access = access
        self.region = region
        self.account = account

    @staticmethod
    def is_api(request: Request) -> bool:
        return request.method == "POST" and (request.header("x-amz-target") or "").startswith(ECS_TARGET_PREFIX)

    def handle(self, request: Request) -> Reply:
        def error(status: int, code: str, message: str) -> Reply:
            body = json.dumps({"__type": code, "message": message}).encode()
            return Reply(status, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-ErrorType": code}, body)

        operation = (request.header("x-amz-target") or "")[len(ECS_TARGET_PREFIX) :]
        if operation != "RunTask":
            return error(400, "UnknownOperationException", f"{operation}: local up answers ECS RunTask only")
        allowed = self.access.check(request, "ecs")
        if isinstance(allowed, Reply):
            return allowed
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return error(400, "SerializationException", "the RunTask body is not JSON")
        definition = str(body.get("taskDefinition") or "")
        launch = self.launches.get(definition)
        if launch is None:
            return error(400, "ClientException", f"TaskDefinition not found: {definition or '(none given)'}")
        caller = role_of_session(str(allowed.get("userArn") or ""))
        refused = run_task_refusal(self.access.authorize, caller, launch)
        if refused is not None:
            code, _, message = refused.partition(": ")
            return error(400, code, message)
        cluster = str(body.get("cluster") or "default").rsplit("/", 1)[-1]  # a name or an ARN
        task_arn = f"arn:aws:ecs:{self.region}:{self.account}:task/{cluster}/{uuid.uuid4().hex}"
        task = {
            "taskArn": task_arn, "taskDefinitionArn": launch.arn, "lastStatus": "PROVISIONING",
            "desiredStatus": "RUNNING", "launchType": "FARGATE", "overrides": body.get("overrides") or {},
        }  # fmt: skip
        return Reply(
            200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps({"tasks": [task], "failures": []}).encode()
        )


def report_task_stopped(
    deployments: Mapping[str, Mapping[str, Any]],
    cloudwatch: Any,
    *,
    region: str,
    cluster_arn: str,
    task_arn: str,
    launch: TaskLaunch,
    exit_code: int | None,
) -> dict[str, str]:
    """ECS's task state change event of a stopped task, delivered to the rules of `deployments` (state entries);
    the state of each alarm that a matched rule feeds, by name."""
    from servestack.local.events import deliver, rules_and_alarms, task_stopped_event

    account = launch.arn.split(":")[4]  # the task definition's account is the task's
    event = task_stopped_event(
        region=region, account=account, cluster_arn=cluster_arn, task_arn=task_arn,
        task_definition_arn=launch.arn, container=launch.container, exit_code=exit_code,
    )  # fmt: skip
    rules, alarms = rules_and_alarms(deployments)
    return deliver(event, rules, alarms, cloudwatch)


def task_outcome(line: str) -> dict[str, Any] | None:
    """The batch task's last line, when it is its outcome (servestack/adapters/batch.py `main`)."""
    try:
        outcome = json.loads(line)
    except ValueError:
        return None
    return outcome if isinstance(outcome, dict) else None


def run_as_schedule(about: dict[str, Any], name: str, entry: dict[str, Any], overrides: Mapping[str, Any]) -> int:
    """`local run-batch` of a Fargate deployment: RunTask on local up as the schedule's role (refused: exit 1
    with the AccessDenied), then the task's container as a process here, as its task role; 0 when it exits 0.
    Its output is shown as it comes; when it stops, ECS's event goes to the rules, and a failed run's reason (the
    task's outcome line) and the alarm it raised are said."""
    import subprocess
    import sys

    from botocore.config import Config
    from botocore.exceptions import ClientError

    from servestack.failures import CommandError, ExitCode
    from servestack.local.sagemaker import role_client

    launch = TaskLaunch.from_dict(entry["task"])
    role_arn = str(entry.get("schedule_role") or "")
    if not role_arn:
        raise CommandError(f"{name}: the state file names no schedule role for it; restart `servestack local up`")
    environment = batch_overrides(overrides)
    config = Config(retries={"mode": "standard", "max_attempts": 1})
    ecs = role_client(about, role_arn, "ecs", endpoint_url=about["aws_api_url"], config=config)
    cluster_arn = str(entry.get("target") or "")  # an ECS target's ARN is its cluster's
    try:
        started = ecs.run_task(**run_task_request(launch, environment, cluster_arn or None))
    except ClientError as refused:
        raise CommandError(
            f"the schedule's role {role_arn} could not start the task: {refused}", ExitCode.FAILED
        ) from None
    finally:
        ecs.close()
    region = str(about.get("region") or "us-east-1")
    argv, cwd, env = task_process(
        launch,
        host_environment=os.environ,
        endpoints=task_endpoints(about["endpoint_url"], about["aws_api_url"], region),
        keys=(about.get("identities") or {}).get(launch.role or "", {}),
        overrides=environment,
    )
    task_arn = started["tasks"][0]["taskArn"]
    print(f"task {task_arn.rsplit('/', 1)[-1]} of {name} started as {role_arn.rsplit('/', 1)[-1]}: "
          f"{' '.join(launch.argv)} in its image ({cwd}), as {launch.role}", file=sys.stderr)  # fmt: skip
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, errors="replace")
    assert process.stdout is not None
    last = ""
    for line in process.stdout:  # shown as it comes; the last line is the run's outcome
        sys.stdout.write(line)
        sys.stdout.flush()
        last = line if line.strip() else last
    code = process.wait()
    states = _stopped(about, cluster_arn, task_arn, launch, code)
    if code != 0:
        error = (task_outcome(last) or {}).get("error") or {}
        why = f"{error['type']}: {error['message']}" if "type" in error else "its output above says why"
        print(f"{name}: the run failed, its task exited {code}: {why}", file=sys.stderr)
    for alarm, state in states.items():
        print(f"{name}: alarm {alarm} is {state} (`servestack local status` shows it)", file=sys.stderr)
    return 0 if code == 0 else 1


def _stopped(about: dict[str, Any], cluster_arn: str, task_arn: str, launch: TaskLaunch, code: int) -> dict[str, str]:
    """The task's stop, reported as ECS reports it (the rules of the running local up's deployments)."""
    from servestack.local.emulator import client_as, developer

    region = str(about.get("region") or "us-east-1")
    cloudwatch = client_as("cloudwatch", about["endpoint_url"], developer(about), region)
    return report_task_stopped(about.get("deployments") or {}, cloudwatch, region=region, cluster_arn=cluster_arn,
                               task_arn=task_arn, launch=launch, exit_code=code)  # fmt: skip
