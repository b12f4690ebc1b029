"""A mutation test of the IAM promise: in a copy of the project, remove one grant from a construct; the same
batch run that passes with the grant fails without it, with the AccessDenied AWS would give, naming the
action and the resource. Green locally means green on `cdk deploy` only if red locally means red there too."""

from __future__ import annotations

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
    schedule: cron(0 2 * * ? *)
"""
GRANT = 'actions=["s3:PutObject", "s3:GetObject", "s3:DeleteObject"]'
WITHOUT_PUT = 'actions=["s3:GetObject", "s3:DeleteObject"]'


def run_batch(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SERVESTACK, "local", "run-batch", "nightly", "--state", str(state)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_removing_the_batch_output_grant_fails_the_run_with_access_denied(tmp_path: Path) -> None:
    # GIVEN a project whose batch construct no longer lets the function write its output prefix
    project = tmp_path / "project"
    spec = copy_project(project, SPEC)
    constructs = project / "servestack" / "cdk" / "batch.py"
    original = constructs.read_text()
    assert original.count(GRANT) == 1, "the grant this test removes is not where it expects it"
    constructs.write_text(original.replace(GRANT, WITHOUT_PUT))
    data = tmp_path / "data"
    # WHEN local up runs its templates and the batch job runs
    with running(tmp_path, "--fresh", "--data-dir", str(data), spec=spec) as up:
        output_prefix = up.deployment("nightly")["input"]["output_prefix"]
        bucket = up.deployment("nightly")["input"]["bucket"]
        failed = run_batch(up.state_path)
    # THEN the run fails with AccessDenied on s3:PutObject for an object under the output prefix
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "AccessDenied" in failed.stderr
    assert "s3:PutObject" in failed.stderr
    assert f"arn:aws:s3:::{bucket}/{output_prefix}" in failed.stderr

    # GIVEN the grant restored WHEN local up runs the re-synthesized templates THEN the same run passes
    constructs.write_text(original)
    with running(tmp_path, "--fresh", "--data-dir", str(data), spec=spec) as up:
        passed = run_batch(up.state_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert '"failed": 0' in passed.stdout
