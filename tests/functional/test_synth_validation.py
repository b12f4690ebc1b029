"""Local mode's synth gives the app the context `cdk synth` gives it, and skips aws-cdk-lib's built-in
CloudFormation validation only where it could not fail the synth (servestack/local/cloudformation/synth.py:
`validation_can_fail`), so it is never more lenient than `cdk synth`: a real CDK app with a misspelt property,
synthesized both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servestack.local.cloudformation.synth import (
    VALIDATE_AGAINST_DEFAULT_RULES,
    SynthError,
    context,
    input_files,
    project_context,
    synthesize,
    validation_can_fail,
)

# A bucket with `BucketNam`: CloudFormation's schema has no such property (rule F3002).
BROKEN_APP = """
import aws_cdk as cdk
app = cdk.App()
stack = cdk.Stack(app, "Broken")
cdk.CfnResource(stack, "Bucket", type="AWS::S3::Bucket", properties={"BucketNam": "x"})
app.synth()
"""


def broken_app(folder: Path, context: dict[str, object]) -> Path:
    folder.mkdir()
    (folder / "app.py").write_text(BROKEN_APP)
    (folder / "cdk.json").write_text(json.dumps({"app": "python app.py", "context": context}))
    spec = folder / "serving.yaml"
    spec.write_text("models: {}\n")
    return spec


def plugins_reported(out_dir: Path) -> list[str]:
    report = json.loads((out_dir / "validation-report.json").read_text())
    return [plugin["pluginName"] for plugin in report.get("pluginReports", [])]


def test_where_validation_can_fail_the_synth_local_mode_runs_it_and_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDK_VALIDATION", raising=False)
    spec = broken_app(tmp_path / "app", {VALIDATE_AGAINST_DEFAULT_RULES: True})
    with pytest.raises(SynthError, match="ValidationFailed"):
        synthesize(spec.parent, spec, tmp_path / "out")
    assert plugins_reported(tmp_path / "out") == ["CloudFormation Validate"]
    report = (tmp_path / "out" / "validation-report.json").read_text()
    assert "'BucketNam' was unexpected" in report


def test_where_validation_can_only_warn_local_mode_skips_it_and_the_templates_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDK_VALIDATION", raising=False)
    spec = broken_app(tmp_path / "app", {})
    result = synthesize(spec.parent, spec, tmp_path / "out")
    template = json.loads((result.out_dir / "Broken.template.json").read_text())
    assert template["Resources"]["Bucket"]["Properties"] == {"BucketNam": "x"}  # as `cdk synth` writes it
    assert not (tmp_path / "out" / "validation-report.json").exists() or plugins_reported(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("context", "can_fail"),
    [
        ({}, False),
        ({VALIDATE_AGAINST_DEFAULT_RULES: True}, True),
        ({VALIDATE_AGAINST_DEFAULT_RULES: "true"}, True),
        ({VALIDATE_AGAINST_DEFAULT_RULES: False}, False),
        ({VALIDATE_AGAINST_DEFAULT_RULES: "false"}, False),
    ],
)
def test_validation_can_fail_reads_the_key_as_aws_cdk_lib_does(context: dict[str, object], can_fail: bool) -> None:
    assert validation_can_fail(context) is can_fail


def test_the_context_has_the_cdk_clis_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cdk.json's `context` over cdk.context.json over ~/.cdk.json's `context`, as `cdk synth` gives them
    (checked against the CDK CLI 2: an app printing `k` printed cdk.json's value with all three set)."""
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / ".cdk.json").write_text(json.dumps({"context": {"k": "user", "only-user": 1}}))
    (project / "cdk.context.json").write_text(json.dumps({"k": "cached", "only-cached": 2}))
    (project / "cdk.json").write_text(json.dumps({"app": "python app.py", "context": {"k": "project"}}))
    spec = project / "serving.yaml"
    spec.write_text("models: {}\n")
    given = context(project, spec)
    assert (given["k"], given["only-user"], given["only-cached"]) == ("project", 1, 2)
    assert given["servestack:spec"] == str(spec.resolve())
    assert project_context(project) == {"k": "project", "only-user": 1, "only-cached": 2}
    # AND the user's settings are an input of the synth: a change there synthesizes again
    assert str(home / ".cdk.json") in input_files(project, spec)


def test_a_context_file_that_is_not_json_is_a_synth_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "cdk.json").write_text("{not json")
    with pytest.raises(SynthError, match=r"cdk\.json: not readable JSON"):
        project_context(tmp_path)


def test_local_mode_compares_with_its_previous_synth_whatever_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aws_cdk import App

    from servestack.cdk.scaling_guard import compare_with

    # GIVEN a shell that tells servestack's guards to read the deployed stacks from AWS
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SERVESTACK_COMPARE_WITH", "deployed")
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "python app.py"}))
    spec = tmp_path / "serving.yaml"
    spec.write_text("models: {}\n")

    # WHEN local mode gives its app the context
    given = context(tmp_path, spec)

    # THEN the guards compare with local mode's previous synth (what it deployed), never with an AWS account
    assert compare_with(App(context=given)) == "last-synth"
    # AND outside local mode the environment decides, as in the pipeline's synth step
    assert compare_with(App()) == "deployed"
