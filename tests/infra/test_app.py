"""The app refuses a bad serving.yaml before synthesizing, and constructs reject bad props by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servestack.spec import SpecError, Strategy
from tests.infra.conftest import REPO, make_project


def test_out_of_range_setting_fails_before_any_stack_is_built(tmp_path: Path) -> None:
    from servestack.cdk import app as cdk_app

    root = make_project(tmp_path)
    spec = yaml.safe_load((root / "serving.yaml").read_text(encoding="utf-8"))
    spec["deployments"]["digits-api"]["strategy"]["canary_percent"] = 150
    spec["deployments"]["cancer-async"]["max_recieve_count"] = 3
    (root / "serving.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")

    with pytest.raises(SpecError) as info:
        cdk_app.build_app(root=root, context={"aws:cdk:bundling-stacks": []}, outdir=str(tmp_path / "out"))

    assert "deployments.digits-api.strategy.canary_percent: 150 is not in 1..99" in info.value.problems
    assert any(p.startswith("deployments.cancer-async.max_recieve_count: unknown key") for p in info.value.problems)
    assert not list((tmp_path / "out").glob("*.template.json"))


@pytest.mark.slow
def test_python_app_py_exits_2_with_the_problem_on_stderr(tmp_path: Path) -> None:
    spec = yaml.safe_load((REPO / "serving.yaml").read_text(encoding="utf-8"))
    spec["deployments"]["digits-realtime"]["instance_type"] = "g5.xlarge"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")

    done = subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO,
        env={
            "CDK_CONTEXT_JSON": f'{{"servestack:spec": "{tmp_path / "bad.yaml"}"}}',
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )

    assert done.returncode == 2
    assert "deployments.digits-realtime.instance_type: 'g5.xlarge' is not a SageMaker instance type" in done.stderr


def test_strategy_that_outlasts_sagemakers_limit_is_rejected_with_the_numbers() -> None:
    from servestack.cdk.guardrails import sagemaker_execution_timeout_sec

    slow = Strategy(type="linear", linear_step_percent=1, interval_minutes=60)

    with pytest.raises(ValueError, match=r"99 steps x 60 min \+ 10 min bake needs \d+ s, which is not <= 28800 s"):
        sagemaker_execution_timeout_sec(slow)
    assert sagemaker_execution_timeout_sec(Strategy(type="all_at_once", bake_minutes=0)) == 1800


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runner": "k8s"}, "BatchJob: runner='k8s' is not one of 'lambda', 'fargate', 'transform'"),
        ({"retry_attempts": 500}, "BatchJob: retry_attempts=500 is not in 0..185"),
        ({"schedule": "daily"}, "BatchJob: schedule='daily' is not 'cron(...)' or 'rate(...)'"),
        ({"runner": "fargate"}, "BatchJob: runner='fargate' needs image, got None"),
    ],
)
def test_construct_props_are_validated_with_value_and_allowed(kwargs: dict[str, object], message: str) -> None:
    from aws_cdk import App, Stack
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_s3 as s3

    from servestack.cdk.batch import BatchJob

    stack = Stack(App(), "Bare")
    bucket = s3.Bucket(stack, "B")
    code = lambda_.Code.from_inline("def handler(e, c): return None")

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        BatchJob(stack, "Job", name="j", bucket=bucket, model_name="m", code=code, **kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
def test_every_timeout_the_spec_allows_synthesizes_and_one_past_it_is_the_specs_one_line(tmp_path: Path) -> None:
    from servestack.cdk import app as cdk_app

    # GIVEN a serverless deployment at the spec's longest timeout, what the HTTP API integration allows (29 s)
    (tmp_path / "ok").mkdir()
    root = make_project(tmp_path / "ok")
    spec = yaml.safe_load((root / "serving.yaml").read_text(encoding="utf-8"))
    spec["deployments"]["digits-api"]["timeout_sec"] = 29
    (root / "serving.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    context = {"aws:cdk:bundling-stacks": [], "servestack:deployments": "digits-api"}
    # WHEN it synthesizes THEN the function and its route wait 29 s
    assembly = cdk_app.build_app(root=root, context=context, outdir=str(tmp_path / "out"), nag=False).synth()
    resources = assembly.get_stack_by_name("servestack-digits-api").template["Resources"].values()
    functions = [r for r in resources if r["Type"] == "AWS::Lambda::Function" and r["Properties"]["Timeout"] == 29]
    assert len(functions) == 1
    routes = [r for r in resources if r["Type"] == "AWS::ApiGatewayV2::Integration"]
    assert [r["Properties"]["TimeoutInMillis"] for r in routes] == [29_000]
    # AND one second more is the spec's one line, through the app as `cdk synth` runs it, before any construct
    spec["deployments"]["digits-api"]["timeout_sec"] = 30
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO,
        env={"CDK_CONTEXT_JSON": f'{{"servestack:spec": "{tmp_path / "bad.yaml"}"}}', "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "deployments.digits-api.timeout_sec: 30 is not in 1..29" in done.stderr
