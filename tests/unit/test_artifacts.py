"""serving.yaml checks that need the disk or the kept lists: model packages (named with the command that
creates a missing one) and SageMaker instance types (with the nearest names)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servestack import artifacts, instance_types
from servestack.spec import SpecError, load_spec, parse_spec
from tests.conftest import ARTIFACTS, REPO_ROOT

SERVESTACK = str(Path(sys.executable).parent / "servestack")


def write_project(root: Path, models: list[dict[str, Any]], deployments: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "serving.yaml").write_text(yaml.safe_dump({"models": models, "deployments": deployments}))
    return root / "serving.yaml"


def copy_package(name: str, version: str, root: Path, as_name: str | None = None, as_version: str = "1") -> Path:
    """A bundled package copied into a project as `as_name@as_version` (manifest rewritten to match)."""
    target = root / "models" / "artifacts" / (as_name or name) / as_version
    shutil.copytree(ARTIFACTS / name / version, target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest |= {"name": as_name or name, "version": as_version}
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_the_bundled_model_list_matches_the_build_recipes() -> None:
    from servestack.sample_models import RECIPES

    assert {name: recipe.version for name, recipe in RECIPES.items()} == artifacts.BUNDLED_MODELS


def test_a_missing_package_names_its_folder_and_the_push_that_creates_it(tmp_path: Path) -> None:
    # GIVEN a project whose serving.yaml pins iris@2, never pushed
    spec_file = write_project(
        tmp_path / "p", [{"name": "iris", "version": 2}], {"iris-api": {"mode": "serverless", "model": "iris"}}
    )
    # WHEN it is loaded THEN the one problem names the folder and the exact command
    with pytest.raises(SpecError) as caught:
        load_spec(spec_file)
    assert caught.value.problems == [
        f"models.0 (iris@2): no model package at {tmp_path / 'p' / 'models/artifacts/iris/2'} (manifest.json missing); "
        "create it: servestack models push MODEL.onnx --name iris --version 2"
    ]


def test_a_package_without_its_model_file_is_named(tmp_path: Path) -> None:
    spec_file = write_project(
        tmp_path / "p", [{"name": "iris", "version": 1}], {"iris-api": {"mode": "serverless", "model": "iris"}}
    )
    package = copy_package("digits", "1", tmp_path / "p", as_name="iris")
    (package / "model.onnx").unlink()
    with pytest.raises(SpecError) as caught:
        load_spec(spec_file)
    assert f"{package / 'model.onnx'} (named by {package / 'manifest.json'}) is missing" in caught.value.problems[0]


def test_bundled_models_are_found_from_any_project_but_not_by_synth(tmp_path: Path) -> None:
    # GIVEN a scratch serving.yaml naming the bundled digits model, with no models/ folder of its own
    spec_file = write_project(
        tmp_path / "p", [{"name": "digits", "version": 1}], {"d": {"mode": "serverless", "model": "digits"}}
    )
    # THEN local mode finds the bundled package
    bundled = artifacts.bundled_root()
    assert bundled is not None
    assert artifacts.package_dir(load_spec(spec_file).models[0], tmp_path / "p") == bundled / "digits" / "1"
    # AND synth (which packages <root>/<path>) says what builds it there
    with pytest.raises(SpecError) as caught:
        load_spec(spec_file, artifacts_root=tmp_path / "p", bundled=False)
    out = tmp_path / "p" / "models" / "artifacts"
    assert caught.value.problems[0].endswith(f"create it: python -m servestack.sample_models --out {out} digits")
    # AND in the servestack repository itself the command is `make models`
    assert artifacts.creating_command(load_spec(spec_file).models[0], REPO_ROOT) == "make models"


def test_the_model_folder_for_local_up_links_a_projects_own_and_bundled_packages(tmp_path: Path) -> None:
    # GIVEN a project with its own iris package (and an older version) that also names the bundled digits
    root = tmp_path / "p"
    models = [{"name": "iris", "version": 1}, {"name": "digits", "version": 1}]
    spec_file = write_project(root, models, {"a": {"mode": "serverless", "model": "iris"}})
    copy_package("breast-cancer", "1", root, as_name="iris")
    copy_package("breast-cancer", "1", root, as_name="iris", as_version="0")
    spec = load_spec(spec_file)
    # WHEN local up asks for one folder of packages
    folder = artifacts.model_dir_for(spec, root, tmp_path / "scratch")
    # THEN it links every project package and the bundled one, as <name>/<version>/
    linked = sorted(str(p.relative_to(folder).parent) for p in folder.glob("*/*/manifest.json"))
    assert linked == ["digits/1", "iris/0", "iris/1"]
    assert (folder / "digits" / "1").resolve() == (artifacts.bundled_root() / "digits" / "1").resolve()
    # AND a project holding all its packages is used as it is
    only_own = write_project(
        tmp_path / "q", [{"name": "iris", "version": 1}], {"a": {"mode": "serverless", "model": "iris"}}
    )
    copy_package("digits", "1", tmp_path / "q", as_name="iris")
    assert (
        artifacts.model_dir_for(load_spec(only_own), tmp_path / "q", tmp_path / "s2") == tmp_path / "q/models/artifacts"
    )


def test_local_up_refuses_a_missing_package_and_an_unknown_instance_type_before_starting(tmp_path: Path) -> None:
    # GIVEN a serving.yaml with a realtime deployment on ml.g5.huge of a model never pushed
    spec_file = write_project(
        tmp_path / "p",
        [{"name": "iris", "version": 1}],
        {"iris-rt": {"mode": "realtime", "model": "iris", "instance_type": "ml.g5.huge"}},
    )
    # WHEN local up starts on it
    done = subprocess.run(
        [SERVESTACK, "local", "up", "--spec", str(spec_file)], capture_output=True, text=True, timeout=120, check=False
    )
    # THEN it exits 2 at once, naming the instance type's nearest names, then (once that is fixed) the package
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "deployments.iris-rt.instance_type: 'ml.g5.huge' is not a SageMaker instance type" in done.stderr
    assert "nearest: ml.g5.xlarge" in done.stderr
    spec_file.write_text(spec_file.read_text().replace("ml.g5.huge", "ml.g5.xlarge"))
    done = subprocess.run(
        [SERVESTACK, "local", "up", "--spec", str(spec_file)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "servestack models push MODEL.onnx --name iris --version 1" in done.stderr


@pytest.mark.parametrize(
    ("value", "nearest"),
    [("ml.g5.huge", "ml.g5.xlarge"), ("g5.xlarge", "ml.g5.xlarge"), ("ml.c6i.xlarg", "ml.c6i.xlarge")],
)
def test_an_unknown_instance_type_is_refused_with_the_nearest_names(value: str, nearest: str) -> None:
    data = {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {"d": {"mode": "realtime", "model": "digits", "instance_type": value}},
    }
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    (problem,) = caught.value.problems
    assert problem.startswith(f"deployments.d.instance_type: {value!r} is not a SageMaker instance type")
    assert nearest in problem.split("nearest: ")[1].split(" (list")[0].split(", ")


def test_known_instance_types_pass_in_every_place_serving_yaml_takes_one() -> None:
    data = {
        "models": [{"name": "digits", "version": 1}, {"name": "breast-cancer", "version": 1}],
        "deployments": {
            "rt": {
                "mode": "realtime",
                "model": "digits",
                "instance_type": "ml.c7i.xlarge",
                "shadow": {"model": "breast-cancer", "instance_type": "ml.c5.large"},
            },
            "ab": {
                "mode": "realtime",
                "model": "digits",
                "variants": [{"name": "a", "model": "digits", "instance_type": "ml.g6.xlarge"}],
            },
            "gpu-async": {
                "mode": "async",
                "model": "digits",
                "backend": "sagemaker",
                "instance_type": "ml.g4dn.xlarge",
            },
        },
    }
    assert parse_spec(data).deployments["rt"].instance_type == "ml.c7i.xlarge"  # type: ignore[union-attr]


def test_the_kept_instance_type_list_is_botocores() -> None:
    # GIVEN the list kept in the repository and the installed botocore's SageMaker service model
    kept = json.loads(instance_types.DATA_FILE.read_text())
    # THEN they agree (after a botocore upgrade: python -m servestack.instance_types --refresh)
    assert kept["enums"] == instance_types.from_botocore()["enums"]
    assert "ml.g5.xlarge" in kept["enums"]["ProductionVariantInstanceType"]
    assert "ml.m5.xlarge" in kept["enums"]["TransformInstanceType"]


def test_local_up_seeds_packages_pushed_beyond_serving_yaml(tmp_path: Path) -> None:
    from servestack.inference.registry import ModelRegistry
    from servestack.registry import open_registry, seed_local

    # GIVEN a project that declares iris@1 and holds a pushed iris@2 too
    root = tmp_path / "p"
    spec_file = write_project(root, [{"name": "iris", "version": 1}], {"a": {"mode": "serverless", "model": "iris"}})
    copy_package("digits", "1", root, as_name="iris")
    copy_package("breast-cancer", "1", root, as_name="iris", as_version="2")
    # WHEN local up seeds its (fresh) registry
    uri = str(tmp_path / "registry")
    seed_local(None, load_spec(spec_file), root / "models" / "artifacts", uri=uri)
    # THEN both versions are there, and `live` is serving.yaml's
    registry: ModelRegistry = open_registry(uri)
    assert registry.versions("iris") == ["1", "2"]
    assert registry.aliases("iris") == {"live": "1"}
