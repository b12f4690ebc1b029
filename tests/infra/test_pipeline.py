"""The CDK Pipelines pipeline: source -> synth (make test + make synth) -> staging + smoke -> approval ->
production + smoke."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match, Template

from tests.infra.conftest import Synth


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
    assert ".venv/bin/python -m stacks.smoke" in commands


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
