"""The CDK Pipelines pipeline: source -> synth (make test + make synth) -> staging + smoke -> approval ->
production + smoke."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from tests.infra.conftest import REPO, Synth


def test_pipeline_stages_run_in_release_order(synth: Synth) -> None:
    (pipeline,) = [r for r in synth.pipeline["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    stages = [s["Name"] for s in pipeline["Properties"]["Stages"]]

    assert stages[:2] == ["Source", "Build"]
    assert stages.index("Staging") < stages.index("Production")
    staging = next(s for s in pipeline["Properties"]["Stages"] if s["Name"] == "Staging")
    production = next(s for s in pipeline["Properties"]["Stages"] if s["Name"] == "Production")
    staging_actions = sorted(staging["Actions"], key=lambda a: a["RunOrder"])
    production_actions = sorted(production["Actions"], key=lambda a: a["RunOrder"])
    assert staging_actions[-1]["Name"] == "SmokeTestStaging"
    assert production_actions[0]["Name"] == "PromoteToProduction"
    assert production_actions[0]["ActionTypeId"]["Category"] == "Approval"
    assert production_actions[-1]["Name"] == "SmokeTestProduction"


def test_source_is_a_codestar_connection_and_synth_runs_the_tests(synth: Synth) -> None:
    t = Template.from_json(synth.pipeline)

    t.has_resource_properties(
        "AWS::CodePipeline::Pipeline",
        {
            "Stages": Match.array_with(
                [
                    Match.object_like(
                        {
                            "Name": "Source",
                            "Actions": [
                                Match.object_like(
                                    {
                                        "ActionTypeId": Match.object_like({"Provider": "CodeStarSourceConnection"}),
                                        "Configuration": Match.object_like(
                                            {"FullRepositoryId": "acme/serving", "BranchName": "main"}
                                        ),
                                    }
                                )
                            ],
                        }
                    )
                ]
            )
        },
    )
    projects = [r for r in synth.pipeline["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    specs = [json.loads(p["Properties"]["Source"]["BuildSpec"]) for p in projects]
    commands = [c for s in specs for phase in s["phases"].values() for c in phase.get("commands", [])]
    assert "make test" in commands
    assert "make synth" in commands
    assert ".venv/bin/python -m servestack.cdk.smoke" in commands


def test_each_stage_deploys_its_own_copy_of_the_chosen_deployments(synth: Synth) -> None:
    stage_templates = {p.parent.name: [] for p in synth.outdir.glob("assembly-*/*.template.json")}
    for p in synth.outdir.glob("assembly-*/*.template.json"):
        stage_templates[p.parent.name].append(json.loads(p.read_text(encoding="utf-8")))

    assert sorted(stage_templates) == [
        "assembly-servestack-pipeline-Production",
        "assembly-servestack-pipeline-Staging",
    ]
    for stage, templates in stage_templates.items():
        prefix = "servestack-" + stage.rsplit("-", 1)[-1].lower() + "-"
        dashboards = sorted(
            r["Properties"]["DashboardName"]
            for t in templates
            for r in t["Resources"].values()
            if r["Type"] == "AWS::CloudWatch::Dashboard"
        )
        assert dashboards == [f"{prefix}cancer-nightly", f"{prefix}digits-api"]


CONNECTION_ARN = "arn:aws:codeconnections:us-east-1:123456789012:connection/0f2b5e1c-5c3a-4b7e-9a8d-1e2f3a4b5c6d"


def cdk_synth(*flags: str, outdir: Path) -> subprocess.CompletedProcess[str]:
    """`node_modules/.bin/cdk synth <flags>` in the repository with its virtual environment active (cdk.json's
    `python3 app.py` is its Python), as the docs tell a user to run it."""
    env = {
        **os.environ,
        "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(REPO / ".venv"),
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    return subprocess.run(
        [str(REPO / "node_modules/.bin/cdk"), "synth", *flags, "--no-notices", "--quiet", "--output", str(outdir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def test_app_docstring_shows_the_pipeline_form_the_next_test_runs() -> None:
    from servestack.cdk import app as cdk_app

    assert (
        "cdk synth -c servestack:pipeline=true -c servestack:repo=owner/name -c servestack:connection-arn=arn:..."
        in (cdk_app.__doc__ or "")
    )


@pytest.mark.slow
def test_the_documented_pipeline_synth_passes_cdk_nag(tmp_path: Path) -> None:
    # GIVEN the form of app.py's docstring: no account, no region (an environment-agnostic pipeline stack)
    # WHEN the CDK CLI synthesizes it, with every deployment, bundling and cdk-nag's AwsSolutions checks
    done = cdk_synth(
        "-c",
        "servestack:pipeline=true",
        "-c",
        "servestack:repo=acme/serving",
        "-c",
        f"servestack:connection-arn={CONNECTION_ARN}",
        outdir=tmp_path / "cdk.out",
    )

    # THEN it succeeds: every finding of the generated roles is acknowledged, partition included
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert "AwsSolutions-" not in done.stdout + done.stderr
    template = json.loads((tmp_path / "cdk.out" / "servestack-pipeline.template.json").read_text(encoding="utf-8"))
    assert "111111111111" not in json.dumps(template)  # no placeholder account
    source = next(
        action
        for r in template["Resources"].values()
        if r["Type"] == "AWS::CodePipeline::Pipeline"
        for stage in r["Properties"]["Stages"]
        for action in stage["Actions"]
        if stage["Name"] == "Source"
    )
    assert source["Configuration"]["FullRepositoryId"] == "acme/serving"
    assert source["Configuration"]["ConnectionArn"] == CONNECTION_ARN


@pytest.mark.slow
@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"servestack:connection-arn": CONNECTION_ARN}, "servestack:repo"),
        ({"servestack:repo": "acme/serving"}, "servestack:connection-arn"),
    ],
)
def test_a_missing_repo_or_connection_exits_2_naming_the_flag(
    tmp_path: Path, given: dict[str, str], missing: str
) -> None:
    # GIVEN the pipeline asked for with one of its two required context values left out
    flags = [arg for key, value in given.items() for arg in ("-c", f"{key}={value}")]

    # WHEN the documented command runs
    done = cdk_synth("-c", "servestack:pipeline=true", *flags, outdir=tmp_path / "cdk.out")

    # THEN it fails, naming the `-c` flag to pass, and no placeholder is synthesized
    assert done.returncode != 0
    assert f"-c {missing}=" in done.stderr
    assert not (tmp_path / "cdk.out" / "servestack-pipeline.template.json").exists()


def test_generated_role_acknowledgements_are_partition_aware() -> None:
    from aws_cdk import App, Stack

    from servestack.cdk.pipeline import _generated_findings_for

    findings = _generated_findings_for(Stack(App(), "Bare"), ["Project"], "Bucket")

    assert [key for key in findings if "arn:aws:" in key] == []
    assert sum("Resource::arn:<AWS::Partition>:" in key for key in findings) == 4  # logs and report groups x2


def smoke_role_statements(synth: Synth, stage: str) -> list[dict[str, Any]]:
    """The statements of the smoke step's CodeBuild role in `stage` (its default policy)."""
    (policy,) = [
        r
        for logical, r in synth.pipeline["Resources"].items()
        if r["Type"] == "AWS::IAM::Policy" and logical.startswith(f"Pipeline{stage}SmokeTest{stage}Role")
    ]
    return policy["Properties"]["PolicyDocument"]["Statement"]


def arn(service: str, resource: str) -> dict[str, Any]:
    """An ARN as the pipeline template writes it: partition, region and account of the pipeline's stack."""
    parts = ["arn:", {"Ref": "AWS::Partition"}, f":{service}:", {"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"}]
    return {"Fn::Join": ["", [*parts, f":{resource}"]]}


@pytest.mark.parametrize("stage", ["Staging", "Production"])
def test_smoke_step_role_may_call_exactly_what_the_smoke_test_calls_in_its_stage(synth: Synth, stage: str) -> None:
    # GIVEN the pipeline's two deployments per stage: digits-api (serverless) and cancer-nightly (batch)
    statements = smoke_role_statements(synth, stage)
    prefix = f"servestack-{stage.lower()}-"
    # THEN servestack/cdk/smoke.py's calls are allowed on this stage's resources alone: Lambda Invoke of the serverless
    # deployment's `live` alias, and GetSchedule of the batch deployment's schedule
    assert {
        "Effect": "Allow",
        "Action": "lambda:InvokeFunction",
        "Resource": arn("lambda", f"function:{prefix}digits-api:live"),
    } in statements
    assert {
        "Effect": "Allow",
        "Action": "scheduler:GetSchedule",
        # in the deployment's own schedule group (servestack/cdk/batch.py)
        "Resource": arn("scheduler", f"schedule/{prefix}cancer-nightly/{prefix}cancer-nightly"),
    } in statements
    # AND the role gets nothing else beyond CodeBuild's own (logs, reports, the artifact bucket and its key)
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    services = {a.split(":")[0] for a in actions}
    assert services == {"logs", "codebuild", "s3", "kms", "lambda", "scheduler"}
    assert {a for a in actions if a.split(":")[0] in {"lambda", "scheduler"}} == {
        "lambda:InvokeFunction",
        "scheduler:GetSchedule",
    }


def test_smoke_grants_name_the_resources_each_mode_creates(synth: Synth) -> None:
    from servestack.cdk.deployment import DeploymentStack

    # GIVEN every deployment stack of the session's app (realtime, components, serverless, async, batch)
    stacks = {s.deployment: s for s in synth.app.node.children if isinstance(s, DeploymentStack)}
    grants = {name: (s.smoke_grant.action, s.smoke_grant.resources) for name, s in stacks.items()}
    # THEN each grant is the call servestack/cdk/smoke.py makes for its kind, on the name its template gives the
    # resource
    assert grants["digits-realtime"] == ("sagemaker:InvokeEndpoint", ("endpoint/servestack-digits-realtime",))
    assert grants["two-models"] == (
        "sagemaker:InvokeEndpoint",
        ("endpoint/servestack-two-models", "inference-component/servestack-two-models-digits"),
    )
    assert grants["digits-api"] == ("lambda:InvokeFunction", ("function:servestack-digits-api:live",))
    assert grants["cancer-async"] == ("lambda:InvokeFunction", ("function:servestack-cancer-async-submit",))
    assert grants["cancer-nightly"] == (
        "scheduler:GetSchedule",
        ("schedule/servestack-cancer-nightly/servestack-cancer-nightly",),
    )
    named = {
        ("digits-realtime", "AWS::SageMaker::Endpoint", "EndpointName", "servestack-digits-realtime"),
        ("two-models", "AWS::SageMaker::InferenceComponent", "InferenceComponentName", "servestack-two-models-digits"),
        ("digits-api", "AWS::Lambda::Function", "FunctionName", "servestack-digits-api"),
        ("cancer-async", "AWS::Lambda::Function", "FunctionName", "servestack-cancer-async-submit"),
        ("cancer-nightly", "AWS::Scheduler::Schedule", "Name", "servestack-cancer-nightly"),
        ("cancer-nightly", "AWS::Scheduler::Schedule", "GroupName", "servestack-cancer-nightly"),
    }
    for deployment, type_, prop, name in named:
        values = [r["Properties"].get(prop) for r in synth.resources(deployment, type_).values()]
        assert name in values, (deployment, type_, values)
    # AND every realtime and batch deployment has one (the smoke test covers every mode)
    assert all(isinstance(s.smoke_grant.resources, tuple) and s.smoke_grant.resources for s in stacks.values())


def test_a_pipeline_without_arm64_images_registers_no_emulator(synth: Synth) -> None:
    from servestack.cdk.pipeline import BINFMT_IMAGE

    # GIVEN the session's pipeline, whose stages build x86_64 code only
    # THEN no CodeBuild project of it runs the arm64 emulator's registration (tests/infra/test_arm64.py: one does)
    assert BINFMT_IMAGE not in json.dumps(build_commands(synth.pipeline))


def build_commands(pipeline: dict) -> list[list[str]]:
    """Each CodeBuild project's commands (install phase, then the others), in the template's order."""
    projects = [r for r in pipeline["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    specs = [json.loads(p["Properties"]["Source"]["BuildSpec"]) for p in projects]
    return [[c for phase in s["phases"].values() for c in phase.get("commands", [])] for s in specs]


@pytest.mark.slow
def test_a_project_not_built_with_make_gives_the_pipeline_its_own_commands(tmp_path: Path) -> None:
    from servestack.cdk import app as cdk_app
    from tests.infra.conftest import PIPELINE_CONTEXT, make_project

    # GIVEN a project whose cdk.json names its own install, build and smoke-test commands (JSON lists)
    (tmp_path / "project").mkdir()
    root = make_project(tmp_path / "project")
    context = {
        **PIPELINE_CONTEXT,
        "servestack:pipeline-deployments": "digits-api",
        "servestack:pipeline-install-commands": ["pip install -r requirements.txt", "npm ci"],
        "servestack:pipeline-build-commands": ["python -m pytest tests", "npx cdk synth"],
        "servestack:pipeline-smoke-commands": ["python -m servestack.cdk.smoke"],
        "aws:cdk:bundling-stacks": [],
    }
    # WHEN the app synthesizes its pipeline
    assembly = cdk_app.build_app(
        root=root, context=context, outdir=str(tmp_path / "out"), nag=False, builtin_validation=False
    ).synth()
    commands = build_commands(assembly.get_stack_by_name("servestack-pipeline").template)
    # THEN the synth step and both smoke steps run them, and none of the Makefile defaults
    assert ["pip install -r requirements.txt", "npm ci", "python -m pytest tests", "npx cdk synth"] in commands
    assert commands.count(["pip install -r requirements.txt", "npm ci", "python -m servestack.cdk.smoke"]) == 2
    assert not [c for step in commands for c in step if c.startswith("make ")]


def test_pipeline_commands_that_are_not_a_list_of_commands_are_refused_by_prop() -> None:
    from aws_cdk import App

    from servestack.cdk.pipeline import MissingContext, PipelineStack

    # GIVEN one command string where a list is expected WHEN the stack is built THEN the prop and value are named
    with pytest.raises(MissingContext, match=r"install_commands='make setup' is not a non-empty list"):
        PipelineStack(
            App(), "p", spec=None, root=Path(), repo="a/b", connection_arn=CONNECTION_ARN,  # type: ignore[arg-type]
            install_commands="make setup",
        )  # fmt: skip


def synth_step(pipeline: dict[str, Any]) -> dict[str, Any]:
    """The CodeBuild project of the pipeline's synth step: the one whose build spec runs `make synth`."""
    projects: list[dict[str, Any]] = [
        r
        for r in pipeline["Resources"].values()
        if r["Type"] == "AWS::CodeBuild::Project"
        and "make synth" in json.dumps(json.loads(r["Properties"]["Source"]["BuildSpec"])["phases"])
    ]
    (project,) = projects
    return project


def test_the_synth_step_may_read_exactly_the_deployed_templates_of_the_apps_stacks(synth: Synth) -> None:
    from servestack.cdk.deployment import DeploymentStack

    # GIVEN the session's app: every deployment as its own stack, and the pipeline's two stages of two of them
    stacks = sorted({s.stack_name for s in synth.app.node.find_all() if isinstance(s, DeploymentStack)})
    assert "Staging-servestack-staging-digits-api" in stacks  # a staged stack's name starts with its stage's
    assert "Production-servestack-production-cancer-nightly" in stacks
    assert f"servestack-{next(iter(synth.deployments))}" in stacks
    project = synth_step(synth.pipeline)

    # THEN its synth step compares with the deployed templates (servestack/cdk/scaling_guard.py)
    environment = project["Properties"]["Environment"]["EnvironmentVariables"]
    assert {"Name": "SERVESTACK_COMPARE_WITH", "Type": "PLAINTEXT", "Value": "deployed"} in environment
    # AND its role's one CloudFormation permission is GetTemplate, on exactly those stacks
    role = project["Properties"]["ServiceRole"]["Fn::GetAtt"][0]
    statements = [
        statement
        for r in synth.pipeline["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"]["Roles"]
        for statement in r["Properties"]["PolicyDocument"]["Statement"]
    ]
    cloudformation = [s for s in statements if "cloudformation:" in json.dumps(s["Action"])]
    in_any_order = [{**s, "Resource": sorted(s["Resource"])} for s in cloudformation]
    assert in_any_order == [
        {
            "Effect": "Allow",
            "Action": "cloudformation:GetTemplate",
            # the pipeline's account and region (PIPELINE_CONTEXT); a stack ARN ends in the id of the stack
            "Resource": sorted(f"arn:aws:cloudformation:us-east-1:111111111111:stack/{name}/*" for name in stacks),
        }
    ]
