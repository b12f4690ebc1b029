"""The constructs in a CDK app of any team's: with none of the feature flags of this repository's cdk.json (an
empty context), every deployment of every mode, and the pipeline, synthesize and pass cdk-nag and cfn-lint.
Where a construct depended on a flag (the artifact bucket's access-log delivery did), it now says so itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.conftest import PIPELINE_CONTEXT, make_project
from tests.infra.test_checks import CFN_LINT_IGNORED, CFN_LINT_IGNORED_PIPELINE, cfn_lint


@pytest.mark.slow
def test_every_mode_synthesizes_with_no_feature_flag_and_passes_cdk_nag_and_cfn_lint(tmp_path: Path) -> None:
    from servestack.cdk import app as cdk_app

    # GIVEN a project of every deployment kind, and an app context holding no feature flag at all
    (tmp_path / "project").mkdir()
    root = make_project(tmp_path / "project")
    outdir = tmp_path / "cdk.out"
    context = {**PIPELINE_CONTEXT, "aws:cdk:bundling-stacks": []}
    assert not [key for key in context if key.startswith("@aws-cdk/")]
    # WHEN the app synthesizes, cdk-nag's AwsSolutions checks on
    app = cdk_app.build_app(root=root, context=context, outdir=str(outdir), builtin_validation=False)
    app.synth()  # a cdk-nag finding raises ValidationFailed
    # THEN every template passes cfn-lint
    pipeline = str(outdir / "servestack-pipeline.template.json")
    templates = sorted(str(p) for p in outdir.glob("**/*.template.json") if str(p) != pipeline)
    assert len(templates) > 10
    done = cfn_lint(templates, list(CFN_LINT_IGNORED))
    assert done.returncode == 0, done.stdout + done.stderr
    done = cfn_lint([pipeline], [*CFN_LINT_IGNORED, *CFN_LINT_IGNORED_PIPELINE])
    assert done.returncode == 0, done.stdout + done.stderr
