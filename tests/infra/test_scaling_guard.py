"""An instance type change of an autoscaled SageMaker variant: refused at synth (SageMaker refuses the endpoint
update while the variant is a scaling target), and deployable in the two steps the refusal names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack.cdk.scaling_guard import InstanceTypeChangeRefused
from tests.infra.conftest import REPO, make_project


def synth(project: Path, outdir: Path, instance_type: str, **context: str) -> dict[str, Any]:
    """Synthesize the project's `scored` deployment on `instance_type` into `outdir`; its template."""
    from servestack.cdk import app as cdk_app

    spec = yaml.safe_load((project / "serving.yaml").read_text(encoding="utf-8"))
    spec["deployments"] = {
        "scored": {"mode": "realtime", "model": "digits", "instance_type": instance_type},
        "queued": {"mode": "async", "model": "digits", "backend": "sagemaker", "instance_type": instance_type},
    }
    (project / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    settings = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    settings |= {"aws:cdk:bundling-stacks": [], **context}
    cdk_app.build_app(root=project, context=settings, outdir=str(outdir), nag=False, builtin_validation=False).synth()
    return {
        name: json.loads((outdir / f"servestack-{name}.template.json").read_text(encoding="utf-8"))
        for name in ("scored", "queued")
    }


def scaling_targets(template: dict[str, Any]) -> list[str]:
    return sorted(
        r["Properties"]["ResourceId"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
    )


@pytest.mark.slow
def test_an_autoscaled_variants_instance_type_change_is_refused_then_deploys_in_two_steps(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project")
    outdir = tmp_path / "cdk.out"
    # GIVEN a realtime and an async SageMaker deployment last synthesized (deployed) on ml.m5.large, autoscaled
    first = synth(project, outdir, "ml.m5.large")
    assert scaling_targets(first["scored"]) == ["endpoint/servestack-scored/variant/primary"]
    assert scaling_targets(first["queued"]) == ["endpoint/servestack-queued/variant/AllTraffic"]

    # WHEN the instance type changes in serving.yaml
    # THEN synth refuses it, quoting SageMaker's rule and naming the two deploys
    with pytest.raises(InstanceTypeChangeRefused) as refused:
        synth(project, outdir, "ml.m5.xlarge")
    message = str(refused.value)
    assert message.startswith(
        "deployments.scored: variant primary's instance_type ml.m5.large -> ml.m5.xlarge is not deployable"
    )
    assert "if the update would change the instance type for any model that is a target for auto scaling" in message
    assert "https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html" in message
    assert "-c servestack:suspend-scaling=scored" in message

    # AND step 1 (old type, scaling suspended) removes the scaling targets, changing nothing else of the endpoint
    step1 = synth(project, outdir, "ml.m5.large", **{"servestack:suspend-scaling": "scored,queued"})
    assert scaling_targets(step1["scored"]) == []
    assert scaling_targets(step1["queued"]) == []
    configs = [r for r in step1["scored"]["Resources"].values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
    assert configs[0]["Properties"]["ProductionVariants"][0]["InstanceType"] == "ml.m5.large"
    # AND step 2 (the new type, no flag) is accepted, with the targets back
    step2 = synth(project, outdir, "ml.m5.xlarge")
    assert scaling_targets(step2["scored"]) == ["endpoint/servestack-scored/variant/primary"]
    assert scaling_targets(step2["queued"]) == ["endpoint/servestack-queued/variant/AllTraffic"]


@pytest.mark.slow
def test_a_first_synth_or_an_unchanged_type_is_never_refused(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project")
    outdir = tmp_path / "cdk.out"
    # GIVEN no previous synth, then the same instance type again / THEN both synthesize
    assert scaling_targets(synth(project, outdir, "ml.c6i.large")["scored"])
    assert scaling_targets(synth(project, outdir, "ml.c6i.large")["scored"])
