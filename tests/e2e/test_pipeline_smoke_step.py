"""The pipeline's smoke step, run locally against `local up` as CodePipeline runs it after the staging deploy:
the step's own commands from the synthesized pipeline template, under the step role's keys, with IAM enforced.
It passes with the template's statements; with the statement it needs removed from the template, the same step
fails with the AccessDenied AWS would give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import copy_project, running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two syntheses: local up's, and the pipeline's
SPEC = """\
models:
  - name: digits
    version: 1
  - name: breast-cancer
    version: 1
deployments:
  digits-api:
    mode: serverless
    model: digits
  cancer-nightly:
    mode: batch
    model: breast-cancer
    schedule: cron(0 2 * * ? *)
"""
# The app with its pipeline, and local up's stacks named as the staging stage names them.
PIPELINE_CONTEXT = {
    "servestack:pipeline": "true",
    "servestack:repo": "acme/serving",
    "servestack:connection-arn": "arn:aws:codeconnections:us-east-1:123456789012:connection/0f2b5e1c",
    "servestack:prefix": "servestack-staging-",
}


def step(state: Path, template: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "servestack.local.codebuild.pipeline_step", "SmokeTestStaging", "--state", str(state)]
    chosen = ["--template", str(template)] if template else ["--synth"]
    return subprocess.run([*argv, *chosen], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip


def without_statement(template: dict[str, Any], action: str) -> dict[str, Any]:
    """The pipeline template with the staging smoke role's statement allowing `action` removed."""
    mutated = json.loads(json.dumps(template))
    removed = 0
    for logical_id, resource in mutated["Resources"].items():
        if resource["Type"] == "AWS::IAM::Policy" and "SmokeTestStagingRole" in logical_id:
            statements = resource["Properties"]["PolicyDocument"]["Statement"]
            kept = [s for s in statements if s["Action"] != action]
            removed += len(statements) - len(kept)
            resource["Properties"]["PolicyDocument"]["Statement"] = kept
    assert removed == 1, f"the staging smoke role holds {removed} statements allowing {action}"
    return dict(mutated)


def test_the_staging_smoke_step_passes_under_its_role_and_fails_without_its_statement(tmp_path: Path) -> None:
    # GIVEN a project whose app synthesizes its pipeline, local up running the staging stage's stacks
    project = tmp_path / "project"
    spec = copy_project(project, SPEC)
    cdk_json = json.loads((project / "cdk.json").read_text())
    cdk_json["context"] |= PIPELINE_CONTEXT
    (project / "cdk.json").write_text(json.dumps(cdk_json, indent=2))
    (project / ".venv").symlink_to(REPO_ROOT / ".venv")  # what the step's `make setup` leaves
    with running(tmp_path, "--fresh", "--data-dir", str(tmp_path / "data"), spec=spec) as up:
        # WHEN the staging smoke step runs from the pipeline template (the app synthesized with its pipeline)
        passed = step(up.state_path)
        # THEN it invokes each deployment as its role allows and passes
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert "digits-api: ok" in passed.stdout
        assert "cancer-nightly: ok" in passed.stdout
        assert "assumed-role/servestack-pipeline-PipelineStagingSmokeTestStag" in passed.stdout
        # WHEN a statement the smoke test needs is removed from the template THEN the step fails with AccessDenied
        template = json.loads((project / ".servestack/pipeline.out/servestack-pipeline.template.json").read_text())
        for action, deployment in (
            ("lambda:InvokeFunction", "digits-api"),
            ("scheduler:GetSchedule", "cancer-nightly"),
        ):
            mutated = tmp_path / f"pipeline-without-{action.replace(':', '-')}.json"
            mutated.write_text(json.dumps(without_statement(template, action)))
            failed = step(up.state_path, mutated)
            assert failed.returncode == 1, failed.stdout + failed.stderr
            assert "AccessDenied" in failed.stdout + failed.stderr
            assert action in failed.stdout + failed.stderr
            assert f"{deployment}: ok" not in failed.stdout
