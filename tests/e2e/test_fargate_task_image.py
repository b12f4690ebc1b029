"""`local run-batch` of a Fargate batch deployment runs what `cdk deploy` ships: the task definition's
container from the image's staged build context in cdk.out (its COPYs, WORKDIR, ENV, the task definition's entry
point and environment), reading the model that image carries, started as the schedule's role.

The project's working tree has no model package once local up has synthesized: in AWS the task has only its
image, so a run that still read the working tree would end in ModelLoadError here, as it would in the cloud."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servestack.local.emulator.callers import signed
from servestack.local.iam.identities import DEVELOPER
from servestack.local.scheduler.api import FIRE_PREFIX, FIRE_SUFFIX
from tests.e2e.conftest import LocalUp, copy_project, start_local_up
from tests.e2e.iam_surface import cli, statements, store, without

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
  minutely:
    mode: batch
    model: digits
    engine: fargate
    schedule: rate(1 minute)
"""
ROWS = 12


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalUp, dict[str, Any], dict[str, Any]]]:
    where = tmp_path_factory.mktemp("fargate-image")
    spec = copy_project(where / "project", SPEC)
    local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"), spec=spec)
    # The model package leaves the working tree once cdk.out holds the image's build context (the image has it).
    package = spec.parent / "models" / "artifacts" / "digits" / "1"
    request = json.loads((package / "sample-request.json").read_text())
    response = json.loads((package / "sample-response.json").read_text())
    shutil.rmtree(spec.parent / "models" / "artifacts")
    try:
        yield local, request, response
    finally:
        assert local.stop() == 0, local.log_text()[-4000:]


def put_rows(up: LocalUp, request: dict[str, Any]) -> tuple[str, str]:
    """ROWS copies of the sample's first instance as the run's input; (bucket, output prefix)."""
    environment = up.deployment("weekly")["task"]["environment"]
    bucket = environment["SERVESTACK_BATCH_BUCKET"]
    rows = "".join(json.dumps(request["instances"][0]) + "\n" for _ in range(ROWS))
    s3 = up.emulator("s3")
    s3.put_object(Bucket=bucket, Key=f"{environment['SERVESTACK_BATCH_INPUT_PREFIX']}rows.jsonl", Body=rows.encode())
    return bucket, environment["SERVESTACK_BATCH_OUTPUT_PREFIX"]


def test_the_fargate_task_runs_from_its_image_and_scores_with_the_model_the_image_carries(
    up: tuple[LocalUp, dict[str, Any], dict[str, Any]],
) -> None:
    # GIVEN a Fargate batch deployment whose working tree no longer holds its model package, and input rows
    local, request, response = up
    bucket, output = put_rows(local, request)
    # WHEN `local run-batch` runs it
    ran = cli("local", "run-batch", "weekly", "--state", str(local.state_path))
    # THEN the task ran from the image's staged context and loaded the model that context carries
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    task = local.deployment("weekly")["task"]
    workdir = Path(task["cwd"])
    assert workdir.parts[-2:] == ("opt", "program")  # the image's WORKDIR, in its staged files
    assert (workdir / "models" / "artifacts" / "digits" / "1" / "model.onnx").is_file()
    assert task["environment"]["SERVESTACK_MODEL_DIR"] == str(workdir / "models" / "artifacts")
    s3 = local.emulator("s3")
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{output}manifest.json")["Body"].read())
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    # AND every answer is the model's: the package's sample response
    answers = []
    for part in manifest["parts"]:
        body = s3.get_object(Bucket=bucket, Key=f"{output}{part['key']}")["Body"].read().decode()
        answers += [json.loads(line) for line in body.splitlines()]
    assert len(answers) == ROWS
    assert {json.dumps(a["prediction"]) for a in answers} == {json.dumps(response["predictions"][0])}


@pytest.mark.parametrize("action", ["ecs:RunTask", "iam:PassRole"])
def test_local_run_batch_starts_the_task_as_the_schedules_role(
    up: tuple[LocalUp, dict[str, Any], dict[str, Any]], action: str
) -> None:
    # GIVEN the schedule's role without its statement that allows `action` (RunTask on the task definition, or
    # PassRole of the task's roles to ECS)
    local, _, _ = up
    roles = store(local)["roles"]
    (statement,) = [
        s for s in statements(roles)
        if s.role.startswith("servestack-weekly-") and "SchedulerRole" in s.role and action in s.actions
    ]  # fmt: skip
    store(local, "PUT", statement.role, without(roles, statement))
    try:
        # WHEN `local run-batch` runs the Fargate deployment
        refused = cli("local", "run-batch", "weekly", "--state", str(local.state_path))
    finally:
        store(local, "PUT", statement.role, roles[statement.role]["policies"])
    # THEN the run is refused to the schedule's role, naming the action, as the schedule would be
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "AccessDenied" in refused.stderr
    assert action in refused.stderr
    assert f"assumed-role/{statement.role}/" in refused.stderr


def test_the_schedules_ecs_target_runs_the_same_task_from_its_image(
    up: tuple[LocalUp, dict[str, Any], dict[str, Any]],
) -> None:
    # GIVEN a Fargate deployment on a one-minute schedule, input rows, and no model package in the working tree
    local, request, response = up
    environment = local.deployment("minutely")["task"]["environment"]
    bucket, output = environment["SERVESTACK_BATCH_BUCKET"], environment["SERVESTACK_BATCH_OUTPUT_PREFIX"]
    rows = "".join(json.dumps(request["instances"][0]) + "\n" for _ in range(ROWS))
    s3 = local.emulator("s3")
    s3.put_object(Bucket=bucket, Key=f"{environment['SERVESTACK_BATCH_INPUT_PREFIX']}rows.jsonl", Body=rows.encode())
    # WHEN the schedule fires (now, through the scheduler's own runner: RunTask as its role, its retries and
    # dead-letter queue; that a schedule fires by itself on its expression is tests/e2e/test_transform_schedule_fires)
    fire = f"{local.api}{FIRE_PREFIX}{local.deployment('minutely')['schedule_name']}{FIRE_SUFFIX}"
    status, answer = signed("POST", fire, DEVELOPER, "us-east-1", service="sagemaker", timeout_sec=120)
    assert (status, json.loads(answer)) == (200, {"invoked": True}), answer[:500]
    deadline = time.monotonic() + 240
    manifest: dict[str, Any] = {}
    while manifest.get("rows", {}).get("total") != ROWS:  # a run that fired before the rows were there has none
        assert time.monotonic() < deadline, f"no scheduled run scored the rows:\n{local.log_text()[-4000:]}"
        time.sleep(1)
        if s3.list_objects_v2(Bucket=bucket, Prefix=f"{output}manifest.json").get("Contents"):
            manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{output}manifest.json")["Body"].read())
    # THEN the task scored every row with the model its image carries
    assert manifest["rows"] == {"total": ROWS, "succeeded": ROWS, "failed": 0}
    body = s3.get_object(Bucket=bucket, Key=f"{output}{manifest['parts'][0]['key']}")["Body"].read().decode()
    assert json.loads(body.splitlines()[0])["prediction"] == response["predictions"][0]
