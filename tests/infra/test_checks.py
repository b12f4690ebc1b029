"""Static checks over the session's synthesized templates: cfn-lint and cdk-nag (AwsSolutions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.infra.conftest import Synth

# cfn-lint rules ignored on generated templates, each with its reason.
CFN_LINT_IGNORED = {
    "W3005": "CDK adds explicit DependsOn (e.g. a function on its role's policy) that a GetAtt already "
    "implies; harmless on generated templates and needed for ordering the policy before first use.",
}


# Ignored only on the pipeline template, which CDK Pipelines generates whole.
CFN_LINT_IGNORED_PIPELINE = {
    "E3703": "a style rule (prefer Fn::Sub over Fn::Join with an empty delimiter) firing on the role ARNs CDK "
    "Pipelines writes into its CloudFormation deploy actions; the template deploys as is.",
}


def cfn_lint(templates: list[str], ignored: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from cfnlint.runner import main; sys.exit(main())",
            "--format",
            "parseable",
            "--ignore-checks",
            *ignored,
            "--",
            *templates,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_cfn_lint_finds_no_errors_or_warnings(synth: Synth) -> None:
    pipeline = str(synth.outdir / "servestack-pipeline.template.json")
    templates = sorted(str(p) for p in synth.outdir.glob("**/*.template.json") if str(p) != pipeline)
    assert len(templates) == len(synth.deployments) + 2 * 2  # + the pipeline's two stages' stacks

    done = cfn_lint(templates, list(CFN_LINT_IGNORED))
    pipeline_done = cfn_lint([pipeline], [*CFN_LINT_IGNORED, *CFN_LINT_IGNORED_PIPELINE])

    assert done.returncode == 0, done.stdout + done.stderr
    assert pipeline_done.returncode == 0, pipeline_done.stdout + pipeline_done.stderr


def test_cdk_nag_has_no_unacknowledged_finding(synth: Synth) -> None:
    assert synth.validation_error is None, synth.validation_error


def acknowledgements(app: object) -> dict[str, dict[str, str]]:
    """cdk-nag acknowledgements by construct path (CDK's own CloudFormation-Validate ones left out)."""
    from aws_cdk import Validations

    found: dict[str, dict[str, str]] = {}
    for c in app.node.find_all():  # type: ignore[attr-defined]
        for entry in c.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                ours = {k: v for k, v in entry.data.items() if "AwsSolutions-" in k}
                if ours:
                    found.setdefault(c.node.path, {}).update(ours)
    return found


def test_every_nag_acknowledgement_carries_a_specific_reason(synth: Synth) -> None:
    acks = acknowledgements(synth.app)

    assert acks  # the IAM wildcard findings below exist and are acknowledged, not absent
    for path, rules in acks.items():
        for rule, reason in rules.items():
            assert len(reason) >= 40, (path, rule, reason)
    rules = {r.split("::", 1)[-1].split("[", 1)[0] for rs in acks.values() for r in rs}
    assert rules <= {
        "AwsSolutions-IAM4",
        "AwsSolutions-IAM5",
        "AwsSolutions-L1",
        "AwsSolutions-S1",
        "AwsSolutions-SQS3",
        "AwsSolutions-ECS2",
        "AwsSolutions-CB4",
    }


@pytest.mark.slow
def test_cdk_nag_is_live_and_fails_synth_on_a_violation(tmp_path: object) -> None:
    """Negative control: the same plugin set-up rejects an unencrypted, TLS-optional queue with no DLQ."""
    from aws_cdk import App, Stack, Validations
    from aws_cdk import aws_sqs as sqs
    from cdk_nag import AwsSolutionsChecks

    app = App(outdir=str(tmp_path))
    sqs.Queue(Stack(app, "Bad"), "Queue", encryption=sqs.QueueEncryption.UNENCRYPTED)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))

    with pytest.raises(Exception, match="AwsSolutions-SQS"):
        app.synth()
