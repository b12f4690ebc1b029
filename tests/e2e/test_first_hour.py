"""A user's first hour past the sample, from a scratch project folder: train iris in scikit-learn, push two
versions with `servestack models push` (skl2onnx's defaults, ZipMap and all), pin them in serving.yaml
deployments of all four modes (single-model, no `multi_model`), run `local up` from a subfolder, and check
that every mode answers what scikit-learn predicts for the pinned version; then load-test the deployment
through boto3 (`sagemaker://`, `lambda://`) against local up's AWS APIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import yaml

from tests.e2e.conftest import start_local_up

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
NAMES = ["setosa", "versicolor", "virginica"]
# The developer's keys local up prints: its AWS APIs and its emulator check every call's signature and IAM.
LOCAL_CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "local", "aws_secret_access_key": "local"}


@dataclass
class Project:
    root: Path
    workdir: Path  # a subfolder, where the user runs every command
    state: dict[str, Any]
    rows: np.ndarray
    v1: np.ndarray  # scikit-learn's predictions for `rows`, version 1
    v2: np.ndarray  # ... version 2
    env: dict[str, str]
    predict_v2: Any  # scikit-learn's version 2 model's predict, as a list

    def cli(self, *argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [SERVESTACK, *argv], cwd=self.workdir, env={**self.env, **env}, capture_output=True, text=True, timeout=180
        )
        assert not check or done.returncode == 0, done.stdout + done.stderr
        return done


def train(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """Version 1: iris as it is; version 2: a model whose every answer differs (classes shifted by one), so
    a deployment serving the wrong version cannot pass."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, target = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    rows = features[::15]
    classifiers = []
    for version, labels in (("1", target), ("2", (target + 1) % 3)):
        classifier = LogisticRegression(max_iter=1000).fit(features, labels)
        (folder / f"iris-v{version}.onnx").write_bytes(to_onnx(classifier, features[:1]).SerializeToString())
        classifiers.append(classifier)
    v1, v2 = (c.predict(rows) for c in classifiers)
    assert (v1 != v2).all()
    return rows, v1, v2, lambda x: classifiers[1].predict(x).tolist()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("first-hour")
    workdir = root / "training"
    workdir.mkdir()
    # a new project: an empty serving.yaml of its own, and what `servestack init` writes around it (init keeps it)
    (root / "serving.yaml").touch()
    init = subprocess.run([SERVESTACK, "init", str(root)], capture_output=True, text=True, timeout=60, check=False)
    assert init.returncode == 0, init.stderr
    assert "kept  serving.yaml" in init.stdout
    rows, v1, v2, predict_v2 = train(workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    user = Project(root, workdir, {}, rows, v1, v2, env, predict_v2)

    # GIVEN two versions pushed from the subfolder, the first with class names
    first = user.cli("models", "push", "iris-v1.onnx", "--name", "iris", "--labels", ",".join(NAMES))
    assert "models:\n  - name: iris\n    version: 1" in first.stdout  # the snippet for an empty serving.yaml
    user.cli("models", "push", "iris-v2.onnx", "--name", "iris")
    # AND serving.yaml pinning them in all four modes, without multi_model
    spec = {
        "models": [{"name": "iris", "version": 1}, {"name": "iris", "version": 2}],
        "deployments": {
            "iris-realtime": {"mode": "realtime", "model": "iris", "version": 2, "instance_type": "ml.c5.large"},
            "iris-api": {"mode": "serverless", "model": "iris", "version": 1},
            "iris-async": {"mode": "async", "model": "iris", "version": 1},
            "iris-nightly": {"mode": "batch", "model": "iris", "version": 2, "schedule": "rate(1 day)"},
        },
    }
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    # WHEN local up starts from the subfolder (its state goes to the project, found from there)
    up = start_local_up(root, cwd=workdir, env=env, found_state=root / ".servestack" / "local.json", timeout_sec=120)
    try:
        user.state = up.state
        yield user
    finally:
        assert up.stop() == 0, up.log_text()[-4000:]


def request_file(user: Project) -> str:
    path = user.workdir / "rows.json"
    path.write_text(json.dumps({"instances": user.rows.tolist()}))
    return str(path)


def test_realtime_serves_the_pinned_version_2(project: Project) -> None:
    answer = json.loads(project.cli("invoke", "iris-realtime", "--data", request_file(project)).stdout)
    assert (answer["model"], answer["version"]) == ("iris", "2")
    assert answer["predictions"] == project.v2.tolist()
    assert answer["labels"] == project.v2.tolist()  # no --labels: the graph's classes, integers as trained


def test_serverless_serves_version_1_although_version_2_is_newer(project: Project) -> None:
    answer = json.loads(project.cli("invoke", "iris-api", "--data", request_file(project)).stdout)
    assert (answer["model"], answer["version"]) == ("iris", "1")
    assert answer["predictions"] == project.v1.tolist()
    assert answer["labels"] == [NAMES[p] for p in project.v1]


def test_async_serves_version_1(project: Project) -> None:
    answer = json.loads(project.cli("invoke", "iris-async", "--data", request_file(project)).stdout)
    assert answer["predictions"] == project.v1.tolist()


def test_batch_scores_its_seeded_sample_with_version_2(project: Project) -> None:
    # GIVEN the sample request push wrote for iris@2, which local up seeded as the batch input
    sample = json.loads((project.root / "models/artifacts/iris/2/sample-request.json").read_text())["instances"]
    # WHEN the batch deployment runs now
    done = project.cli("local", "run-batch", "iris-nightly")
    # THEN its output holds version 2's predictions for those rows
    manifest_uri = done.stdout.strip().splitlines()[-2]
    bucket, _, key = manifest_uri.removeprefix("s3://").partition("/")
    s3 = boto3.session.Session(**LOCAL_CREDENTIALS).client("s3", endpoint_url=project.state["endpoint_url"])
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    prefix = key.removesuffix("manifest.json")  # part keys are relative to the output prefix
    lines = [
        json.loads(line)
        for part in manifest["parts"]
        for line in s3.get_object(Bucket=bucket, Key=prefix + part["key"])["Body"].read().decode().splitlines()
    ]
    assert [line["prediction"] for line in lines] == project.predict_v2(np.array(sample, dtype=np.float32))


def deployed_name(project: Project, target: str, deployment: str) -> str:
    """The name boto3 calls: the endpoint's or the function's, as the template names it (local up prints it)."""
    entry = project.state["deployments"][deployment]
    if target == "sagemaker://":
        return str(entry["endpoint_name"])
    (function,) = entry["lambda_functions"].values()
    return f"{function}:live"


@pytest.mark.parametrize(("target", "deployment"), [("sagemaker://", "iris-realtime"), ("lambda://", "iris-api")])
def test_loadtest_reaches_the_deployments_through_boto3(project: Project, target: str, deployment: str) -> None:
    report = project.workdir / f"{deployment}.json"
    done = project.cli(
        "loadtest",
        f"{target}{deployed_name(project, target, deployment)}",
        "--endpoint-url",
        project.state["aws_api_url"],
        "--region",
        "us-east-1",
        "--data",
        request_file(project),
        "--concurrency",
        "2",
        "--duration",
        "1",
        "--report",
        str(report),
        "--plot",
        str(project.workdir / f"{deployment}.png"),
        AWS_ACCESS_KEY_ID=LOCAL_CREDENTIALS["aws_access_key_id"],
        AWS_SECRET_ACCESS_KEY=LOCAL_CREDENTIALS["aws_secret_access_key"],
    )
    measured = json.loads(report.read_text())
    assert set(measured["statuses"]) == {"200"}, done.stdout
    assert "pass --target-qps N" in done.stdout


def test_the_registry_of_local_up_holds_both_pushed_versions(project: Project) -> None:
    listing = json.loads(project.cli("models", "list", "--json").stdout)
    assert listing["iris"]["versions"] == ["1", "2"]
