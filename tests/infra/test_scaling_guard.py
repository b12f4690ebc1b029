"""The guards of a SageMaker endpoint update: an instance type change of an autoscaled variant (SageMaker refuses
the endpoint update while the variant is a scaling target), deployable in the two steps the refusal names, and a
renamed or removed variant of a blue/green endpoint; each compared with the deployed stack's template (the
pipeline's fresh checkout, here served by moto's CloudFormation over HTTP) or with the last synth (locally)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack.cdk.scaling_guard import InstanceTypeChangeRefused, UnverifiableChange, VariantRenameRefused
from tests.infra.conftest import REPO, make_project


def synth_deployments(
    project: Path, outdir: Path, deployments: dict[str, dict[str, Any]], **context: str
) -> dict[str, dict[str, Any]]:
    """Synthesize the project with exactly `deployments` into `outdir`; their templates by deployment name."""
    from servestack.cdk import app as cdk_app

    spec = yaml.safe_load((project / "serving.yaml").read_text(encoding="utf-8"))
    spec["deployments"] = deployments
    (project / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    settings = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    settings |= {"aws:cdk:bundling-stacks": [], **context}
    cdk_app.build_app(root=project, context=settings, outdir=str(outdir), nag=False, builtin_validation=False).synth()
    return {
        name: json.loads((outdir / f"servestack-{name}.template.json").read_text(encoding="utf-8"))
        for name in deployments
    }


def synth(project: Path, outdir: Path, instance_type: str, **context: str) -> dict[str, Any]:
    """Synthesize the project's `scored` (realtime) and `queued` (SageMaker async) deployments on
    `instance_type` into `outdir`; their templates."""
    deployments = {
        "scored": {"mode": "realtime", "model": "digits", "instance_type": instance_type},
        "queued": {"mode": "async", "model": "digits", "backend": "sagemaker", "instance_type": instance_type},
    }
    return synth_deployments(project, outdir, deployments, **context)


def scored_on(instance_type: str) -> dict[str, dict[str, Any]]:
    return {"scored": {"mode": "realtime", "model": "digits", "instance_type": instance_type}}


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


# --- compared with the deployed stack: the pipeline's fresh checkout ---------------------------------------------
@pytest.fixture
def cloudformation(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's CloudFormation over HTTP, which the app's boto3 reaches through AWS_ENDPOINT_URL, with the SSM
    parameter a CDK template's BootstrapVersion reads; the synth compares with the deployed stack, as the
    pipeline's synth step has it (SERVESTACK_COMPARE_WITH=deployed)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto's stores live in this process, whichever server serves them: each test starts with none
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).close()
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SERVESTACK_COMPARE_WITH": "deployed",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    session = boto3.session.Session()  # not boto3's default one, which would keep these keys for later tests
    session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="21", Type="String")
    yield session.client("cloudformation")
    server.stop()


# What moto's CloudFormation creates of a servestack template: the resources the guards read (the endpoint
# configuration and the scaling targets) and those they reference (the models and their role).
MOTO_CREATES = {
    "AWS::SageMaker::Model",
    "AWS::SageMaker::EndpointConfig",
    "AWS::ApplicationAutoScaling::ScalableTarget",
    "AWS::IAM::Role",
}


def deploy(cloudformation: Any, stack: str, template: dict[str, Any]) -> dict[str, Any]:
    """Create `stack` in moto's CloudFormation from `template`, less the resources moto cannot create (it
    cannot resolve an Fn::GetAtt of a metric-math alarm); what GetTemplate serves of it."""
    resources = {k: dict(r) for k, r in template["Resources"].items() if r["Type"] in MOTO_CREATES}
    for resource in resources.values():
        depends = resource.pop("DependsOn", [])
        kept = [d for d in ([depends] if isinstance(depends, str) else depends) if d in resources]
        if kept:
            resource["DependsOn"] = kept
    created = {k: v for k, v in template.items() if k != "Outputs"} | {"Resources": resources}
    cloudformation.create_stack(StackName=stack, TemplateBody=json.dumps(created), Capabilities=["CAPABILITY_IAM"])
    assert cloudformation.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    served: dict[str, Any] = cloudformation.get_template(StackName=stack, TemplateStage="Original")["TemplateBody"]
    assert served == created
    return served


def fresh_checkout(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A project folder and an output folder that no synth has written to, as in the pipeline's checkout."""
    (tmp_path / name).mkdir()
    return make_project(tmp_path / name), tmp_path / name / "cdk.out"


@pytest.mark.slow
# moto's CloudFormation keeps a scaling target in the stack's template, but warns that it creates none
@pytest.mark.filterwarnings("ignore:Tried to parse AWS:UserWarning")
def test_a_fresh_checkout_compares_with_the_deployed_stack_and_refuses_the_instance_type_change(
    tmp_path: Path, cloudformation: Any
) -> None:
    # GIVEN `scored` deployed on ml.m5.large, autoscaled: its template is the stack's in CloudFormation
    project, outdir = fresh_checkout(tmp_path, "deployed-from")
    deployed = synth_deployments(project, outdir, scored_on("ml.m5.large"))["scored"]
    assert scaling_targets(deployed) == ["endpoint/servestack-scored/variant/primary"]
    served = deploy(cloudformation, "servestack-scored", deployed)
    assert scaling_targets(served) == ["endpoint/servestack-scored/variant/primary"]
    # AND the pipeline's checkout: no earlier synth in its output folder
    project, outdir = fresh_checkout(tmp_path, "pipeline")

    # WHEN serving.yaml moves the variant to ml.m5.xlarge and the synth step runs
    with pytest.raises(InstanceTypeChangeRefused) as refused:
        synth_deployments(project, outdir, scored_on("ml.m5.xlarge"))

    # THEN it is refused against the deployed template, naming the flag of the first of the two deploys
    message = str(refused.value)
    assert message.startswith("deployments.scored: variant primary's instance_type ml.m5.large -> ml.m5.xlarge")
    assert "-c servestack:suspend-scaling=scored" in message
    assert "Compared with the deployed stack servestack-scored (GetTemplate)." in message


@pytest.mark.slow
def test_a_first_deploy_from_a_fresh_checkout_passes(tmp_path: Path, cloudformation: Any) -> None:
    # GIVEN no stack deployed (GetTemplate answers "Stack with id servestack-scored does not exist") and no synth
    project, outdir = fresh_checkout(tmp_path, "pipeline")

    # WHEN the synth step runs / THEN it synthesizes the autoscaled endpoint
    synthesized = synth_deployments(project, outdir, scored_on("ml.m5.large"))["scored"]
    assert scaling_targets(synthesized) == ["endpoint/servestack-scored/variant/primary"]


@pytest.mark.slow
def test_without_the_deployed_template_or_an_earlier_synth_the_change_is_refused_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a synth told to compare with the deployed stack, without credentials to read it, and no earlier synth
    monkeypatch.setenv("SERVESTACK_COMPARE_WITH", "deployed")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    project, outdir = fresh_checkout(tmp_path, "pipeline")

    # WHEN it synthesizes the autoscaled endpoint
    with pytest.raises(UnverifiableChange) as refused:
        synth_deployments(project, outdir, scored_on("ml.m5.large"))

    # THEN it refuses what it cannot verify, naming why and the flag that accepts the variants as synthesized
    message = str(refused.value)
    assert message.startswith("deployments.scored: cannot compare endpoint servestack-scored's variants")
    assert "Unable to locate credentials" in message
    assert "-c servestack:accept-replacement=scored" in message
    # AND with the flag, the same synth passes
    accepted = synth_deployments(
        project, outdir, scored_on("ml.m5.large"), **{"servestack:accept-replacement": "scored"}
    )
    assert scaling_targets(accepted["scored"]) == ["endpoint/servestack-scored/variant/primary"]


# --- renamed or removed variants of a blue/green endpoint ---------------------------------------------------------
def ab(*variants: tuple[str, int]) -> dict[str, dict[str, Any]]:
    """The realtime deployment `ab` with these (name, weight) variants of the digits model."""
    return {
        "ab": {
            "mode": "realtime",
            "model": "digits",
            "variants": [{"name": name, "model": "digits", "weight": weight} for name, weight in variants],
        }
    }


def variant_names(template: dict[str, Any]) -> list[str]:
    (config,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
    return [v["VariantName"] for v in config["Properties"]["ProductionVariants"]]


@pytest.mark.slow
def test_a_renamed_or_removed_variant_of_a_blue_green_endpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project")
    outdir = tmp_path / "cdk.out"
    # GIVEN an A/B endpoint (blue/green updates) last synthesized (deployed) with variants current and candidate
    assert variant_names(synth_deployments(project, outdir, ab(("current", 9), ("candidate", 1)))["ab"]) == [
        "current",
        "candidate",
    ]

    # WHEN candidate is renamed / THEN synth refuses it, quoting SageMaker's rule
    with pytest.raises(VariantRenameRefused) as renamed:
        synth_deployments(project, outdir, ab(("current", 9), ("challenger", 1)))
    message = str(renamed.value)
    assert message.startswith("deployments.ab: variant(s) candidate of endpoint servestack-ab would be renamed")
    assert "your new endpoint configuration must have the same variant name" in message
    assert "https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-exclusions.html" in message
    assert "-c servestack:accept-replacement=ab" in message
    # WHEN candidate is removed / THEN refused the same way
    with pytest.raises(VariantRenameRefused):
        synth_deployments(project, outdir, ab(("current", 10)))
    # AND new weights under the same names are deployable
    assert variant_names(synth_deployments(project, outdir, ab(("current", 1), ("candidate", 1)))["ab"]) == [
        "current",
        "candidate",
    ]
