"""Local mode's synth skips aws-cdk-lib's built-in CloudFormation validation only where it could not fail the
synth (servestack/local/cloudformation/synth.py: `validation_can_fail`), so it is never more lenient than
`cdk synth`: a real CDK app with a misspelt property, synthesized both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servestack.local.cloudformation.synth import (
    VALIDATE_AGAINST_DEFAULT_RULES,
    SynthError,
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
    ("cdk_json", "cdk_context_json", "can_fail"),
    [
        (None, None, False),
        ({}, None, False),
        ({VALIDATE_AGAINST_DEFAULT_RULES: True}, None, True),
        ({VALIDATE_AGAINST_DEFAULT_RULES: "true"}, None, True),
        ({VALIDATE_AGAINST_DEFAULT_RULES: "false"}, None, False),
        ({VALIDATE_AGAINST_DEFAULT_RULES: True}, {VALIDATE_AGAINST_DEFAULT_RULES: False}, False),
        ({}, {VALIDATE_AGAINST_DEFAULT_RULES: True}, True),
    ],
)
def test_validation_can_fail_reads_the_context_as_the_cdk_cli_merges_it(
    tmp_path: Path, cdk_json: dict[str, object] | None, cdk_context_json: dict[str, object] | None, can_fail: bool
) -> None:
    if cdk_json is not None:
        (tmp_path / "cdk.json").write_text(json.dumps({"app": "python app.py", "context": cdk_json}))
    if cdk_context_json is not None:
        (tmp_path / "cdk.context.json").write_text(json.dumps(cdk_context_json))
    assert validation_can_fail(tmp_path) is can_fail


def test_an_unreadable_cdk_json_skips_nothing(tmp_path: Path) -> None:
    (tmp_path / "cdk.json").write_text("{not json")
    assert validation_can_fail(tmp_path) is True
