"""A function whose model packages would take its zip bundle past Lambda's 250 MB unzipped limit is synthesized
as a container image (up to 10 GB) of the same sources, chosen by `lambda_package: auto`, the default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servestack.cdk.sources import RUNTIME_BUNDLE_BYTES, ZIP_LIMIT_BYTES, package_type
from tests.infra.conftest import make_project


def heavy(package: Path, size: int) -> None:
    """A file of `size` bytes the package carries (sparse: no disk is written for it), listed in its manifest."""
    with (package / "weights.bin").open("wb") as file:
        file.truncate(size)
    manifest_path = package / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"name": package.parent.name}
    manifest["files"] = [{"name": "weights.bin", "size": size}]
    manifest_path.write_text(json.dumps(manifest))
    (package / "model.onnx").touch()


def test_auto_picks_an_image_past_the_zip_limit_and_says_why(tmp_path: Path) -> None:
    package = tmp_path / "models" / "artifacts" / "big" / "1"
    package.mkdir(parents=True)
    heavy(package, ZIP_LIMIT_BYTES - RUNTIME_BUNDLE_BYTES - 1024)
    assert package_type("auto", tmp_path, ["models/artifacts/big/1"]) == ("zip", "")
    heavy(package, ZIP_LIMIT_BYTES - RUNTIME_BUNDLE_BYTES + 1024)
    kind, why = package_type("auto", tmp_path, ["models/artifacts/big/1"])
    assert kind == "image"
    assert "pass Lambda's 250 MiB unzipped limit for zip functions" in why
    assert package_type("zip", tmp_path, ["models/artifacts/big/1"])[0] == "zip"  # forced, at the user's word


@pytest.mark.slow
def test_a_serverless_deployment_past_the_limit_synthesizes_as_a_container_image(tmp_path: Path) -> None:
    from servestack.cdk import app as cdk_app

    # GIVEN the serverless deployment's model package holding 120 MB of weights, its spec silent on packaging
    (tmp_path / "project").mkdir()
    root = make_project(tmp_path / "project")
    spec = yaml.safe_load((root / "serving.yaml").read_text())
    heavy(root / "models" / "artifacts" / "digits" / "1", 120 * 2**20)
    assert "lambda_package" not in spec["deployments"]["digits-api"]
    # WHEN the app synthesizes it
    context = {"aws:cdk:bundling-stacks": [], "servestack:deployments": "digits-api"}
    assembly = cdk_app.build_app(root=root, context=context, outdir=str(tmp_path / "out"), nag=True).synth()
    template = assembly.get_stack_by_name("servestack-digits-api").template
    # THEN its function is a container image whose command is the handler, built from a staged context holding
    # the Lambda Dockerfile, the requirements and the package, and the stack still passes cdk-nag
    functions = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    (image,) = [f for f in functions if f.get("PackageType") == "Image"]
    assert image["ImageConfig"]["Command"] == ["handlers.serverless.handler"]
    assets = json.loads((tmp_path / "out" / "servestack-digits-api.assets.json").read_text())["dockerImages"]
    (asset,) = assets.values()
    context_dir = tmp_path / "out" / asset["source"]["directory"]
    assert asset["source"]["dockerFile"] == "lambda.Dockerfile"
    assert (context_dir / "requirements.txt").is_file()
    assert (context_dir / "models/artifacts/digits/1/weights.bin").stat().st_size == 120 * 2**20
    assert (context_dir / "handlers/serverless.py").is_file()
