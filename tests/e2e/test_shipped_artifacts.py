"""`local up` runs what `cdk deploy` ships: the realtime model is fetched from the template's `ModelDataUrl` in
the emulator's S3 with the SageMaker execution role's keys and unpacked under a local `/opt/ml/model`; the
container runs from the image's build context staged in cdk.out (its Dockerfile's COPY, ENV, WORKDIR and
ENTRYPOINT), its image pulled first from the emulator's ECR with the execution role; a Lambda child's log lines
reach its log group under its role. Removing the execution role's S3 read or its image pull from the template
fails the variant with AccessDenied; removing the function role's logs grant is
reported once and is not fatal."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servestack.local.hosting.processes import free_port
from tests.conftest import ARTIFACTS, EVENTS
from tests.e2e.conftest import SERVESTACK, LocalUp, copy_project, start_local_up, wait_for

pytestmark = pytest.mark.slow
SPEC = """\
models:
  - name: digits
    version: 1
deployments:
  rt:
    mode: realtime
    model: digits
    instance_type: ml.m5.large
  fn:
    mode: serverless
    model: digits
"""
DIGITS = json.loads((ARTIFACTS / "digits/1/sample-request.json").read_text())
EXPECTED = json.loads((ARTIFACTS / "digits/1/sample-response.json").read_text())["predictions"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("shipped") / "project", SPEC)


@pytest.fixture(scope="module")
def up(project: Path) -> Iterator[LocalUp]:
    where = project.parent / "shared"
    where.mkdir()
    local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"), spec=project)
    yield local
    assert local.stop() == 0, local.log_text()[-4000:]


def template(project: Path, stack: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((project.parent / ".servestack/cdk.out" / f"{stack}.template.json").read_text())
    return loaded


def of_type(document: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in document["Resources"].values() if r["Type"] == kind]


def test_the_realtime_model_is_fetched_from_model_data_url_under_the_data_dir(up: LocalUp, project: Path) -> None:
    # GIVEN the model data URL the realtime stack's SageMaker model names (a CDK file asset)
    (model,) = of_type(template(project, "servestack-rt"), "AWS::SageMaker::Model")
    url = model["PrimaryContainer"]["ModelDataUrl"]["Fn::Sub"]
    bucket, key = (
        url.removeprefix("s3://")
        .replace("${AWS::AccountId}", "123456789012")
        .replace("${AWS::Region}", "us-east-1")
        .split("/", 1)
    )
    # THEN local up published the asset where the template says, as `cdk deploy` does
    archive = up.emulator("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        names = set(tar.getnames())
    assert "digits/1/model.onnx" in names
    # AND the variant's container serves from what was unpacked under the data dir's /opt/ml/model
    config = json.loads((project.parent / ".servestack/run/endpoint-servestack-rt.json").read_text())
    (variant,) = config["variants"]
    model_dir = Path(variant["package_dir"])
    assert model_dir.is_relative_to(up.log.parent / "data"), model_dir
    assert model_dir.as_posix().endswith("/opt/ml/model")
    assert (model_dir / "digits/1/model.onnx").read_bytes() == (ARTIFACTS / "digits/1/model.onnx").read_bytes()
    # AND it answers as the packaged model does
    runtime = up.client("sagemaker-runtime")
    answer = runtime.invoke_endpoint(EndpointName="servestack-rt", ContentType="application/json",
                                     Body=json.dumps(DIGITS))  # fmt: skip
    assert json.loads(answer["Body"].read())["predictions"] == EXPECTED


def processes_in(folder: Path) -> list[list[str]]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cwd").readlink() == folder:
                found.append([p.decode() for p in (proc / "cmdline").read_bytes().split(b"\0") if p])
        except OSError:
            continue
    return found


def test_the_container_runs_from_the_staged_image_context(up: LocalUp, project: Path) -> None:
    config = json.loads((project.parent / ".servestack/run/endpoint-servestack-rt.json").read_text())
    (variant,) = config["variants"]
    command = variant["command"]
    workdir = Path(command["cwd"])
    # THEN its working directory is the image's WORKDIR, holding what the Dockerfile COPYs and nothing else:
    # servestack's runtime (no CLI, constructs or local mode), the project's entry points, the requirements
    assert workdir.as_posix().endswith("/opt/program")
    assert (workdir / "servestack/adapters/realtime.py").is_file()
    assert (workdir / "handlers/realtime.py").is_file()
    assert (workdir / "requirements.txt").is_file()
    assert not (workdir / "servestack/cli").exists()
    assert not (workdir / "servestack/local").exists()
    assert not (workdir / "app.py").exists()
    assert not (workdir / "stacks").exists()
    # AND the image's ENTRYPOINT with SageMaker's `serve` argument runs there, with the Dockerfile's ENV
    assert command["argv"][-3:] == ["-m", "handlers.realtime", "serve"]
    assert variant["environment"]["PYTHONDONTWRITEBYTECODE"] == "1"
    assert variant["environment"]["SERVESTACK_PROVIDERS"] == "auto"  # the model's Environment wins over ENV
    running = processes_in(workdir)
    assert any(argv[-1] == "serve" for argv in running), running


def lambda_event() -> bytes:
    event = json.loads((EVENTS / "apiGatewayHttpApiV2Event.json").read_text())
    event["body"] = json.dumps(DIGITS)
    return json.dumps(event).encode()


def test_a_lambda_childs_log_lines_reach_its_log_group_under_its_role(up: LocalUp, project: Path) -> None:
    # GIVEN the function's log group, from its LoggingConfig in the template
    group = up.deployment("fn")["log_groups"]["servestack-fn"]
    # WHEN it is invoked
    invoked = up.client("lambda").invoke(FunctionName="servestack-fn", Payload=lambda_event())
    assert (invoked["StatusCode"], invoked.get("FunctionError")) == (200, None)
    request_id = invoked["ResponseMetadata"]["RequestId"]
    logs = up.emulator("logs")

    def arrived() -> list[str]:
        events = logs.filter_log_events(logGroupName=group).get("events", [])
        return [e["message"] for e in events if request_id in e["message"]]

    # THEN its lines arrive in that group (written with the role's keys: see the mutation test below)
    lines = wait_for(arrived, 30, "the function's log lines in its log group")
    assert any(line.startswith(f"START RequestId: {request_id}") for line in lines), lines
    streams = logs.describe_log_streams(logGroupName=group)["logStreams"]
    assert any("[$LATEST]" in s["logStreamName"] for s in streams), streams
    # AND the realtime container's lines reach the endpoint's group
    endpoint_events = logs.filter_log_events(logGroupName="/aws/sagemaker/Endpoints/servestack-rt").get("events")
    assert endpoint_events, "nothing in the endpoint's log group"


def test_explain_says_what_is_emulated_approximated_and_only_reported(up: LocalUp, project: Path) -> None:
    result = subprocess.run(
        [SERVESTACK, "local", "up", "--explain", "--spec", str(project)],
        cwd=project.parent, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    account = result.stdout.split("how each run compares with the deploy:", 1)[1]
    emulated, rest = account.split("  approximated:", 1)
    approximated, _, reported = rest.partition("  reported, not emulated:")  # nothing, for these two modes
    assert "servestack-rt/primary model data: s3://cdk-hnb659fds-assets-123456789012-us-east-1/" in emulated
    assert "(cpu.Dockerfile): run from its staged build context in cdk.out" in emulated
    assert "servestack-fn logs: to servestack-fn-ServerlessFunctionLogs" in emulated
    assert (
        "FROM public.ecr.aws/docker/library/python:3.12-slim: the base image's system packages are this machine's"
        in approximated
    )
    assert "USER 1000: the process runs as the developer's user" in approximated
    assert "are an environment of the image's own, built for this machine's Python" in approximated
    assert "servestack-rt/primary image pull: cdk-hnb659fds-container-assets-" in emulated
    assert "then pulled with role servestack-rt-RealtimeExecutionRole" in emulated
    assert "the authorization and the manifest; no layer is pushed or downloaded" in emulated
    assert "servestack-rt local deploy: the green fleet starts as a variant does" in emulated
    assert "image pull" not in reported


# ------------------------------------------------------------------------------------------ mutations


@pytest.fixture
def stopped(up: LocalUp) -> LocalUp:
    """The shared local up, stopped: mutation tests edit its synthesized templates and run their own."""
    assert up.stop() == 0, up.log_text()[-4000:]
    return up


def without_action(path: Path, role_fragment: str, action: str) -> str:
    """Removes `action` from the policy of the role `role_fragment` (its statement too, when it held only that
    action); returns the template's original text."""
    original = path.read_text()
    document = json.loads(original)
    removed = 0
    for resource in document["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy" or role_fragment not in json.dumps(resource["Properties"]["Roles"]):
            continue
        kept = []
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            removed += actions.count(action)
            if [a for a in actions if a != action]:
                kept.append({**statement, "Action": [a for a in actions if a != action]})
        resource["Properties"]["PolicyDocument"]["Statement"] = kept
    assert removed == 1, f"expected one {action} grant for {role_fragment}, removed {removed}"
    path.write_text(json.dumps(document))
    return original


def start(project: Path, where: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    where.mkdir()
    state, log_path = where / "local.json", where / "local-up.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVESTACK_LOCAL_STATE": str(state)}
    env.pop("AWS_ENDPOINT_URL", None)
    argv = [SERVESTACK, "local", "up", "--port", str(free_port()), "--aws-port", str(free_port()),
            "--fresh", "--data-dir", str(where / "data"), "--spec", str(project)]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=project.parent, stdout=log, stderr=subprocess.STDOUT, env=env)
    return process, state, log_path


@pytest.mark.parametrize("action", ["s3:GetObject", "ecr:BatchGetImage"])
def test_without_the_execution_roles_model_read_or_image_pull_the_variant_fails_with_access_denied(
    stopped: LocalUp, project: Path, action: str
) -> None:
    path = project.parent / ".servestack/cdk.out/servestack-rt.template.json"
    original = without_action(path, "RealtimeExecutionRole", action)
    try:
        process, state, log_path = start(project, project.parent / f"without-{action.replace(':', '-')}")
        deadline = time.monotonic() + 240
        while process.poll() is None and not state.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)
            pytest.fail(f"local up started without the execution role's {action}:\n{log_path.read_text()[-3000:]}")
    finally:
        path.write_text(original)
    said = log_path.read_text()
    assert process.returncode == 2, said[-3000:]
    assert "variant primary of endpoint servestack-rt failed" in said, said[-3000:]
    assert "AccessDenied" in said, said[-3000:]
    assert action in said, said[-3000:]


def test_without_the_function_roles_logs_grant_the_denial_is_reported_once(stopped: LocalUp, project: Path) -> None:
    path = project.parent / ".servestack/cdk.out/servestack-fn.template.json"
    original = without_action(path, "ServerlessFunctionRole", "logs:PutLogEvents")
    where = project.parent / "no-logs"
    try:
        where.mkdir()
        local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"), spec=project)
    finally:
        path.write_text(original)

    def reported() -> list[str]:
        return [line for line in local.log_text().splitlines() if "cannot write its logs" in line]

    try:
        # WHEN the function runs twice THEN it answers (a denied log write is not fatal)
        request_ids = []
        for _ in range(2):
            invoked = local.client("lambda").invoke(FunctionName="servestack-fn", Payload=lambda_event())
            assert (invoked["StatusCode"], invoked.get("FunctionError")) == (200, None)
            request_ids.append(invoked["ResponseMetadata"]["RequestId"])
        # ...and its first lines' denial is reported, and both invocations' lines have reached local up's output
        # (and with it the function's log shipper)
        wait_for(reported, 60, "the logs denial")
        wait_for(
            lambda: all(f"REPORT RequestId: {rid}" in local.log_text() for rid in request_ids),
            60,
            "both invocations' REPORT lines",
        )
    finally:
        assert local.stop() == 0, local.log_text()[-4000:]
    # THEN the denial is reported once, naming the function, the action and AccessDenied: counted once local up
    # has stopped, for its shippers ship what they hold as they close (the second invocation's lines, refused
    # again, included)
    lines = reported()
    assert len([line for line in lines if "servestack-fn" in line]) == 1, lines
    assert "AccessDenied" in lines[0], lines
    assert "logs:PutLogEvents" in lines[0], lines
