"""A mutation test of the schedule role of an `engine: transform` deployment: in AWS, EventBridge Scheduler calls
SageMaker's CreateTransformJob as the schedule's role, so a role without `sagemaker:CreateTransformJob` on the
job's ARN fails every scheduled run. `servestack local run-batch` makes the same call as the same role: in a copy
of the project whose SchedulerRole lost the grant, the run fails with the AccessDenied AWS would give, naming the
action and the job's ARN; with the grant restored, the same run passes and DescribeTransformJob says Completed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import SERVESTACK, copy_project, running

pytestmark = pytest.mark.slow
SPEC = """\
models:
  - name: breast-cancer
    version: 1
deployments:
  nightly:
    mode: batch
    model: breast-cancer
    engine: transform
    instance_type: ml.m5.large
    instance_count: 1
"""
GRANT = 'actions=["sagemaker:CreateTransformJob"]'
WITHOUT_CREATE = 'actions=["sagemaker:DescribeTransformJob"]'  # a grant of the wrong action: no CreateTransformJob
JOB_ARN = re.compile(r"arn:aws:sagemaker:us-east-1:123456789012:transform-job/servestack-nightly-[a-z0-9]{16}")


def run_batch(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SERVESTACK, "local", "run-batch", "nightly", "--state", str(state)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_schedule_role_without_create_transform_job_fails_the_run_naming_the_action_and_job(
    tmp_path: Path,
) -> None:
    # GIVEN a project whose transform schedule's role may no longer create transform jobs
    project = tmp_path / "project"
    spec = copy_project(project, SPEC)
    constructs = project / "servestack" / "cdk" / "transform_job.py"
    original = constructs.read_text()
    assert original.count(GRANT) == 1, "the grant this test removes is not where it expects it"
    constructs.write_text(original.replace(GRANT, WITHOUT_CREATE))
    data = tmp_path / "data"
    # WHEN local up runs its templates and the transform deployment runs as its schedule would
    with running(tmp_path, "--fresh", "--data-dir", str(data), spec=spec) as up:
        failed = run_batch(up.state_path)
    # THEN the run stops before any job runs, with the CLI's exit code for an AWS refusal (6) and one line naming
    # the action and the job's ARN (name lower-cased, with a 16-character execution id)
    assert failed.returncode == 6, failed.stdout + failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert "AccessDenied" in last
    assert "sagemaker:CreateTransformJob" in last
    assert JOB_ARN.search(last), last
    assert "local workers" not in failed.stderr

    # GIVEN the grant restored WHEN local up runs the re-synthesized templates THEN the same run passes
    constructs.write_text(original)
    with running(tmp_path, "--fresh", "--data-dir", str(data), spec=spec) as up:
        passed = run_batch(up.state_path)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        # AND the job SageMaker would have created is on record, Completed
        name = re.search(r"transform job (servestack-nightly-[a-z0-9]{16}) Completed", passed.stderr)
        assert name is not None, passed.stderr
        sagemaker = up.client("sagemaker")
        described = sagemaker.describe_transform_job(TransformJobName=name.group(1))
        sagemaker.close()
    assert described["TransformJobStatus"] == "Completed"
    assert JOB_ARN.fullmatch(described["TransformJobArn"])
