"""After `servestack models push`, synth works with no other step: the pushed package carries what the stacks
read (model, manifest, sample request and response). A model serving.yaml names but nobody pushed stops the
synth with one line naming the folder and the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servestack.spec import SpecError
from tests.conftest import ARTIFACTS
from tests.infra.conftest import REPO, make_project

SERVESTACK = str(Path(sys.executable).parent / "servestack")


@pytest.mark.slow
def test_a_pushed_models_function_carries_its_own_sample_for_the_pre_traffic_hook(tmp_path: Path) -> None:
    from aws_cdk.assertions import Template

    from servestack.cdk import app as cdk_app

    # GIVEN a project, and the bundled breast-cancer ONNX file pushed into it as a new model `cancer`
    (tmp_path / "project").mkdir()
    root = make_project(tmp_path / "project")
    onnx_file = ARTIFACTS / "breast-cancer" / "1" / "model.onnx"
    pushed = subprocess.run(
        [SERVESTACK, "models", "push", str(onnx_file), "--name", "cancer"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert pushed.returncode == 0, pushed.stderr
    # AND the printed serving.yaml lines added (a serverless deployment of it)
    snippet = yaml.safe_load(pushed.stdout.split("Add to serving.yaml")[1].split("\n", 1)[1])
    spec = yaml.safe_load((root / "serving.yaml").read_text())
    spec["models"] += snippet["models"]
    spec["deployments"] |= snippet["deployments"]
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    # WHEN the app synthesizes that deployment
    context = json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]
    context |= {"aws:cdk:bundling-stacks": [], "servestack:deployments": "cancer-api"}
    assembly = cdk_app.build_app(
        root=root, context=context, outdir=str(tmp_path / "out"), nag=False, builtin_validation=False
    ).synth()

    # THEN the function's code asset carries the pushed package's sample, which the pre-traffic hook asks the
    # new version for, and the hook's environment names only the version it checks
    template = Template.from_json(assembly.get_stack_by_name("servestack-cancer-api").template)
    hooks = [
        r["Properties"]["Environment"]["Variables"]
        for r in template.find_resources("AWS::Lambda::Function").values()
        if r["Properties"]["Handler"] == "index.handler"
    ]
    assert [set(h) for h in hooks] == [{"TARGET_FUNCTION", "REL_TOL"}]
    assets = json.loads((tmp_path / "out" / "servestack-cancer-api.assets.json").read_text())["files"].values()
    (code,) = [Path(a["source"]["path"]) for a in assets if "lambda-source" in a["source"]["path"]]
    package = root / "models" / "artifacts" / "cancer" / "1"
    for name in ("sample-request.json", "sample-response.json"):
        assert (code / "models" / "artifacts" / "cancer" / "1" / name).read_bytes() == (package / name).read_bytes()


def test_synth_of_a_model_nobody_pushed_names_the_folder_and_the_push(tmp_path: Path) -> None:
    from servestack.cdk import app as cdk_app

    # GIVEN serving.yaml naming cancer@3, which is not in the project
    (tmp_path / "project").mkdir()
    root = make_project(tmp_path / "project")
    spec = yaml.safe_load((root / "serving.yaml").read_text())
    spec["models"].append({"name": "cancer", "version": 3})
    spec["deployments"]["cancer-api"] = {"mode": "serverless", "model": "cancer"}
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    # WHEN the app is built THEN it stops before any stack, with one problem naming the folder and the command
    with pytest.raises(SpecError) as caught:
        cdk_app.build_app(root=root, context={"aws:cdk:bundling-stacks": []}, outdir=str(tmp_path / "out"))
    (problem,) = caught.value.problems
    assert str(root / "models" / "artifacts" / "cancer" / "3") in problem
    assert problem.endswith("create it: servestack models push MODEL.onnx --name cancer --version 3")


def test_a_package_without_samples_names_the_command_that_writes_them(tmp_path: Path) -> None:
    from servestack.cdk.deployment import read_sample
    from servestack.spec import load_spec

    (tmp_path / "project").mkdir()
    root = make_project(tmp_path / "project")
    spec = load_spec(root / "serving.yaml", artifacts_root=root, bundled=False)
    (root / "models" / "artifacts" / "digits" / "1" / "sample-response.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"sample-response.json not found for model digits@1: "):
        read_sample(root, spec.model("digits", "1"), "response")
