"""`servestack models push` as a user runs it from a folder of their project: an skl2onnx classifier becomes
a package in the project, with samples, labels and the serving.yaml lines to add; registry commands say
plainly what they changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from servestack.failures import ExitCode
from servestack.spec import load_spec

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
NAMES = "setosa,versicolor,virginica"


@pytest.fixture(scope="module")
def iris_onnx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two iris classifiers converted with skl2onnx's defaults (ZipMap output on)."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    features, target = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    where = tmp_path_factory.mktemp("onnx")
    files = {}
    for name, estimator in (
        ("linear", LogisticRegression(max_iter=500)),
        ("tree", DecisionTreeClassifier(random_state=0)),
    ):
        files[name] = where / f"{name}.onnx"
        files[name].write_bytes(to_onnx(estimator.fit(features, target), features[:1]).SerializeToString())
    return files


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "training").mkdir(parents=True)
    spec = {
        "models": [{"name": "digits", "version": 1}],
        "deployments": {"d": {"mode": "serverless", "model": "digits"}},
    }
    (root / "serving.yaml").write_text(yaml.safe_dump(spec))
    return root


def servestack(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    return subprocess.run([SERVESTACK, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_push_from_a_subfolder_writes_a_complete_package_and_the_lines_to_add(
    project: Path, iris_onnx: dict[str, Path]
) -> None:
    # GIVEN a project, and no local up running
    # WHEN an skl2onnx classifier (ZipMap output) is pushed from a subfolder
    done = servestack("models", "push", str(iris_onnx["linear"]), "--name", "iris", cwd=project / "training")

    # THEN the package lands in the project, with the manifest, the model and both samples
    assert done.returncode == 0, done.stderr
    package = project / "models" / "artifacts" / "iris" / "1"
    assert sorted(p.name for p in package.iterdir()) == [
        "manifest.json",
        "model.onnx",
        "sample-request.json",
        "sample-response.json",
    ]
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["labels"] == [0, 1, 2]
    assert manifest["probability_output"] == "output_probability"
    # AND the output shows the conversion, the labels' source, the checksums and the snippet
    out = done.stdout
    assert "converted output 'output_probability'" in out
    assert "labels   0, 1, 2 (from the graph)" in out
    assert f"sha256   model.onnx {manifest['sha256']}" in out
    snippet = yaml.safe_load(
        out.split("Add to serving.yaml (then `servestack local up`, or `make synth` / `cdk deploy`):\n")[1]
    )
    assert snippet["models"] == [{"name": "iris", "version": 1}]
    assert snippet["deployments"]["iris-api"]["model"] == "iris"
    # AND once the snippet is in serving.yaml, the spec loads with the package found
    spec = yaml.safe_load((project / "serving.yaml").read_text())
    spec["models"] += snippet["models"]
    spec["deployments"] |= snippet["deployments"]
    (project / "serving.yaml").write_text(yaml.safe_dump(spec))
    assert load_spec(project / "serving.yaml").model("iris", "1").key == "iris@1"
    again = servestack("models", "push", str(iris_onnx["linear"]), "--name", "iris", "--version", "1", cwd=project)
    assert "present" in again.stdout
    assert "serving.yaml already declares iris@1" in again.stdout


def test_a_version_without_labels_keeps_the_graphs_and_says_what_the_previous_had(
    project: Path, iris_onnx: dict[str, Path]
) -> None:
    # GIVEN iris@1 pushed with --labels
    first = servestack("models", "push", str(iris_onnx["linear"]), "--name", "iris", "--labels", NAMES, cwd=project)
    assert first.returncode == 0, first.stderr
    # WHEN a retrained model is pushed without --labels
    second = servestack("models", "push", str(iris_onnx["tree"]), "--name", "iris", cwd=project)
    # THEN it is version 2 with the graph's labels, and the output says how to keep version 1's
    assert second.returncode == 0, second.stderr
    manifest = json.loads((project / "models/artifacts/iris/2/manifest.json").read_text())
    assert manifest["labels"] == [0, 1, 2]
    assert f"version 1 has labels {NAMES}; pass --labels {NAMES} to keep them" in second.stdout
    # AND the same version with other bytes is refused with exit 5, naming the way out
    clash = servestack("models", "push", str(iris_onnx["linear"]), "--name", "iris", "--version", "2", cwd=project)
    assert clash.returncode == ExitCode.CONFLICT
    assert clash.stderr.strip().endswith("pass another --version, or leave it out for the next integer")


def test_registry_commands_say_what_changed_in_one_line(
    project: Path, iris_onnx: dict[str, Path], tmp_path: Path
) -> None:
    registry = str(tmp_path / "registry")
    # GIVEN two versions pushed to a registry (and to the project)
    for model in ("linear", "tree"):
        pushed = servestack(
            "models", "push", str(iris_onnx[model]), "--name", "iris", "--registry", registry, cwd=project
        )
        assert pushed.returncode == 0, pushed.stderr
        assert f"{registry} (--registry)" in pushed.stdout

    # WHEN the alias is moved and moved back THEN each step is one plain line
    assert (
        servestack("models", "promote", "iris", "1", "--registry", registry, cwd=project).stdout
        == "iris: live -> 1 (was unset)\n"
    )
    assert (
        servestack("models", "promote", "iris", "2", "--registry", registry, cwd=project).stdout
        == "iris: live 1 -> 2\n"
    )
    assert (
        servestack("models", "rollback", "iris", "--registry", registry, cwd=project).stdout
        == "iris: live 2 -> 1 (rolled back)\n"
    )
    stuck = servestack("models", "rollback", "iris", "--registry", registry, cwd=project)
    assert stuck.returncode == ExitCode.USAGE
    assert stuck.stderr.startswith("servestack models rollback: iris: alias 'live' has no earlier version")
    # AND listing shows it, while an unknown model is an error naming the known ones
    listing = servestack("models", "list", "--registry", registry, "--json", cwd=project)
    assert json.loads(listing.stdout) == {"iris": {"versions": ["1", "2"], "aliases": {"live": "1"}}}
    nope = servestack("models", "list", "nope", "--registry", registry, cwd=project)
    assert nope.returncode == ExitCode.NOT_FOUND
    assert "(allowed: iris)" in nope.stderr


def test_a_pipeline_is_pushed_with_its_columns_and_string_labels_and_no_manifest_editing(project: Path) -> None:
    from tests.pipeline_model import COLUMNS, SPECIES, pipeline_model

    built = pipeline_model()
    # GIVEN a ColumnTransformer pipeline converted with skl2onnx (one [N, 1] input per column, a string one)
    # and a CSV of rows under a header
    rows = [",".join(COLUMNS)] + [",".join(str(built.rows[c][i]) for c in COLUMNS) for i in range(3)]
    (project / "rows.csv").write_text("\n".join(rows) + "\n")
    # WHEN it is pushed with the CSV as its sample
    done = servestack("models", "push", str(built.onnx_file), "--name", "flowers", "--sample", "rows.csv", cwd=project)
    # THEN the manifest records the columns with their dtypes and the class labels, and says so
    assert done.returncode == 0, done.stderr
    package = project / "models" / "artifacts" / "flowers" / "1"
    manifest = json.loads((package / "manifest.json").read_text())
    assert [(c["name"], c["dtype"]) for c in manifest["columns"]] == [
        *[(name, "float32") for name in COLUMNS[:4]],
        ("site", "string"),
    ]
    assert manifest["labels"] == list(SPECIES)
    assert (
        "columns  sepal_length float32, sepal_width float32, petal_length float32, petal_width float32, site string"
        in done.stdout
    )
    # AND the sample request is the CSV's rows, typed by column, with the estimator's answer as the response
    request = json.loads((package / "sample-request.json").read_text())
    assert request["dataframe_split"]["columns"] == list(COLUMNS)
    assert request["dataframe_split"]["data"][0] == [built.rows[c][0] for c in COLUMNS]
    assert json.loads((package / "sample-response.json").read_text())["predictions"] == built.expected[:3]


def test_columns_and_allow_nan_name_the_columns_of_one_input_from_the_command_line(
    project: Path, tmp_path: Path
) -> None:
    from tests.tabular_fixtures import summing_model

    # GIVEN a model with one [N, 3] float input
    source = summing_model(tmp_path / "summing.onnx")
    # WHEN it is pushed with its column names and --allow-nan alone (every float column)
    done = servestack(
        "models", "push", str(source), "--name", "summing", "--columns", "a, b, c", "--allow-nan", cwd=project
    )
    # THEN the manifest has the three columns at their indexes, each allowing NaN, and the output says so
    assert done.returncode == 0, done.stderr
    manifest = json.loads((project / "models/artifacts/summing/1/manifest.json").read_text())
    assert manifest["columns"] == [
        {"name": name, "dtype": "float32", "input": "x", "index": i, "allow_nan": True} for i, name in enumerate("abc")
    ]
    assert "NaN      allowed in a, b, c" in done.stdout
    # AND a name that is no column is refused with exit 2, naming it and the allowed ones
    wrong = servestack(
        "models", "push", str(source), "--name", "summing", "--columns", "a,b,c", "--allow-nan", "d", cwd=project
    )
    assert wrong.returncode == ExitCode.USAGE
    assert "--allow-nan: 'd' is not a column" in wrong.stderr
